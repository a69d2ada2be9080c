#!/bin/sh
# The U-Net's serial operations against PyTorch (Debian's python3-torch) in
# float64: tests/test_unet_ops.c --dump writes GroupNorm's two cases and the
# SiLU and resampling case, tools/unet_ops_oracle.py recomputes them with
# group_norm, silu, interpolate and avg_pool2d and compares within the
# float32 bounds (docs/testing.md).
#   usage: unet_ops_oracle.sh TEST_UNET_OPS MPIEXEC SRCDIR
set -eu
TEST=$1 MPIEXEC=$2 SRC=$3
PY=/usr/bin/python3 # Debian's interpreter, which has torch (a pyenv one may not)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$MPIEXEC" -np 1 "$TEST" --dump "$WORK"
"$PY" "$SRC/tools/unet_ops_oracle.py" "$WORK"/gn_*.bin "$WORK"/local.bin
