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
# With bf16-mixed: fourfold's run and the oracle's products in bf16-mixed
# precision (the oracle rounds the same operands), and the same oracle
# without the rounding beside it, and the oracle with attention's products
# in fp32, which fourfold's results must both be further from
# (tools/gpt_compare.py --plain).
#   usage: gpt_oracle.sh TEST_GPT MPIEXEC SRCDIR [bf16-mixed]
set -eu
TEST_GPT=$1 MPIEXEC=$2 SRC=$3 PRECISION=${4:-fp32}
PY=${FF_PYTHON:-/usr/bin/python3} # Debian's, which has torch (a pyenv one may not)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
oracle() { # DIR PRECISION [ATTENTION]: the oracle on fourfold's files in DIR
    "$PY" "$SRC/tools/gpt_oracle.py" --ckpt "$1/model.bin" --batch "$1/batch.bin" \
        --out "$1" --steps 10 --lr 3e-3 --warmup 3 --min-lr-frac 0.1 --wd 0.1 \
        --beta1 0.9 --beta2 0.95 --eps 1e-8 --clip 1.0 --dtype float64 --ff "$1" \
        --precision "$2" --attention "${3:-bf16}" > "$1/oracle.log" 2>&1 ||
        { cat "$1/oracle.log"; exit 1; }
}
if [ "$PRECISION" = fp32 ]; then
    "$MPIEXEC" -np 1 "$TEST_GPT" --dump "$WORK"
    oracle "$WORK" fp32
    "$PY" "$SRC/tools/gpt_compare.py" "$WORK"
else
    "$MPIEXEC" -np 1 "$TEST_GPT" --bf16-mixed --dump "$WORK"
    mkdir "$WORK/plain" "$WORK/att32"
    cp "$WORK"/model.bin "$WORK"/batch.bin "$WORK"/ff* "$WORK/plain/"
    cp "$WORK"/model.bin "$WORK"/batch.bin "$WORK"/ff* "$WORK/att32/"
    oracle "$WORK" "$PRECISION"
    oracle "$WORK/plain" fp32
    oracle "$WORK/att32" "$PRECISION" fp32
    "$PY" "$SRC/tools/gpt_compare.py" "$WORK" --plain "$WORK/plain" --plain "$WORK/att32"
fi
