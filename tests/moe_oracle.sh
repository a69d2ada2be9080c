#!/bin/sh
# The serial MoE layer against PyTorch (Debian's python3-torch) in float64:
# tests/test_moe.c --dump writes four cases (top-1 and top-2, with and
# without dropping), tools/moe_oracle.py recomputes them from the layer's
# definition (docs/moe.md) and compares assignments exactly and the output,
# loss and gradients within the float32 bound (docs/testing.md).
#   usage: moe_oracle.sh TEST_MOE MPIEXEC SRCDIR
set -eu
TEST_MOE=$1 MPIEXEC=$2 SRC=$3
PY=/usr/bin/python3 # Debian's interpreter, which has torch (a pyenv one may not)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$MPIEXEC" -np 1 "$TEST_MOE" --dump "$WORK"
"$PY" "$SRC/tools/moe_oracle.py" "$WORK"/moe_*.bin
