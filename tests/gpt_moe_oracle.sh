#!/bin/sh
# The serial mixture-of-experts GPT against PyTorch (Debian's python3-torch)
# in float64: test_gpt --dump-moe writes a model with one MoE block of three
# (fourfold's MoE checkpoint format; top-2, capacity factor 1), two
# micro-batches, the gradients of one step over them and each token's
# routing; --dump-moe1 the same with top-1 routing and capacity factor 1.25.
# tools/gpt_moe_oracle.py rebuilds the model from the definition
# (docs/moe.md) and compares every token's routing and the tokens dropped
# exactly, the loss, the load-balancing loss and every gradient within the
# float32 bound (docs/testing.md).
#   usage: gpt_moe_oracle.sh TEST_GPT MPIEXEC SRCDIR [--dump-moe1]
set -eu
TEST_GPT=$1 MPIEXEC=$2 SRC=$3 MODE=${4:---dump-moe}
PY=/usr/bin/python3 # Debian's interpreter, which has torch (a pyenv one may not)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$MPIEXEC" -np 1 "$TEST_GPT" "$MODE" "$WORK"
"$PY" "$SRC/tools/gpt_moe_oracle.py" "$WORK"
