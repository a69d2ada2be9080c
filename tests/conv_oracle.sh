#!/bin/sh
# The serial convolution layer against PyTorch (Debian's python3-torch) in
# float64: tests/test_conv.c --dump writes three cases (3x3 stride 1 and 2
# on odd sizes, 1x1), tools/conv_oracle.py recomputes them with conv2d and
# autograd and compares the output and every gradient element by element
# within the float32 bound (docs/testing.md).
#   usage: conv_oracle.sh TEST_CONV MPIEXEC SRCDIR
set -eu
TEST_CONV=$1 MPIEXEC=$2 SRC=$3
PY=/usr/bin/python3 # Debian's interpreter, which has torch (a pyenv one may not)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$MPIEXEC" -np 1 "$TEST_CONV" --dump "$WORK"
"$PY" "$SRC/tools/conv_oracle.py" "$WORK"/conv_*.bin
