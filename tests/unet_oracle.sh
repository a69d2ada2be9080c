#!/bin/sh
# The serial U-Net against PyTorch (Debian's python3-torch) in float64:
# tests/test_unet.c --dump writes one step of the DDPM objective on the tiny
# U-Net (images, timesteps, noise, parameters, fourfold's loss and
# gradients); tools/unet_oracle.py recomputes it with an independent model
# (torch.cat for the skips, conv2d, group_norm, silu, interpolate,
# avg_pool2d, autograd) and compares the loss and every gradient within the
# float32 bound (docs/testing.md).
#   usage: unet_oracle.sh TEST_UNET MPIEXEC SRCDIR
set -eu
TEST_UNET=$1 MPIEXEC=$2 SRC=$3
PY=/usr/bin/python3 # Debian's interpreter, which has torch (a pyenv one may not)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$MPIEXEC" -np 1 "$TEST_UNET" --dump "$WORK"
"$PY" "$SRC/tools/unet_oracle.py" "$WORK"/unet.bin
