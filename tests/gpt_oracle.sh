#!/bin/sh
# The serial GPT against PyTorch (Debian's python3-torch), an independent
# implementation: fourfold writes a canonical checkpoint (llm.c v3), a batch,
# its logits, loss and gradients of that batch and the losses of 10 AdamW
# steps; tools/gpt_oracle.py rebuilds the model from the checkpoint and does
# the same; tools/gpt_compare.py compares (loss 1e-5, gradients and logits
# 1e-4 relative max error per tensor, step losses 1e-4).
#   usage: gpt_oracle.sh TEST_GPT MPIEXEC SRCDIR
set -eu
TEST_GPT=$1 MPIEXEC=$2 SRC=$3
PY=/usr/bin/python3 # Debian's interpreter, which has torch (a pyenv one may not)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$MPIEXEC" -np 1 "$TEST_GPT" --dump "$WORK"
"$PY" "$SRC/tools/gpt_oracle.py" --ckpt "$WORK/model.bin" --batch "$WORK/batch.bin" \
    --out "$WORK" --steps 10 --lr 3e-3 --warmup 3 --min-lr-frac 0.1 --wd 0.1 \
    --beta1 0.9 --beta2 0.95 --eps 1e-8 --clip 1.0 --dtype float32 > "$WORK/oracle.log" 2>&1 ||
    { cat "$WORK/oracle.log"; exit 1; }
"$PY" "$SRC/tools/gpt_compare.py" "$WORK" --loss-tol 1e-5 --grad-tol 1e-4 --logit-tol 1e-4 \
    --losses-tol 1e-4
