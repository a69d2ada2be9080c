#!/bin/sh
# The serial GPT against PyTorch (Debian's python3-torch) in float64, an
# independent implementation: fourfold writes a canonical checkpoint (llm.c
# v3), a batch, its logits and loss of that batch, and for each of 10 AdamW
# steps (eps 1e-8, weight decay 0.1) its parameters before the step, its loss
# and gradients, and after the steps its parameters and both AdamW moments;
# tools/gpt_oracle.py rebuilds the model from the checkpoint and, in float64,
# computes the loss and gradients at fourfold's parameters of each step and
# runs torch's AdamW on fourfold's gradients; tools/gpt_compare.py compares
# every tensor norm-wise against bounds derived from float32's unit roundoff
# (docs/testing.md).
#   usage: gpt_oracle.sh TEST_GPT MPIEXEC SRCDIR
set -eu
TEST_GPT=$1 MPIEXEC=$2 SRC=$3
PY=${FF_PYTHON:-/usr/bin/python3} # Debian's, which has torch (a pyenv one may not)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$MPIEXEC" -np 1 "$TEST_GPT" --dump "$WORK"
"$PY" "$SRC/tools/gpt_oracle.py" --ckpt "$WORK/model.bin" --batch "$WORK/batch.bin" \
    --out "$WORK" --steps 10 --lr 3e-3 --warmup 3 --min-lr-frac 0.1 --wd 0.1 \
    --beta1 0.9 --beta2 0.95 --eps 1e-8 --clip 1.0 --dtype float64 --ff "$WORK" \
    > "$WORK/oracle.log" 2>&1 || { cat "$WORK/oracle.log"; exit 1; }
"$PY" "$SRC/tools/gpt_compare.py" "$WORK"
