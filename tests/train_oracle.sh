#!/bin/sh
# A checkpoint written by PyTorch in llm.c's format (no fourfold checksum, as
# llm.c writes it) loads in fourfold and gives PyTorch's loss on the same
# token shard, on one rank and on two grids of 4 (tolerance 1e-5 relative,
# issue 4's bound for the loss against the oracle).
#   usage: train_oracle.sh FOURFOLD MPIEXEC SRCDIR
set -eu
FF=$1 MPIEXEC=$2 SRC=$3
PY=/usr/bin/python3 # Debian's interpreter, which has torch
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
want=$("$PY" "$SRC/tools/oracle_checkpoint.py" "$WORK" --seqs 8 --seq 32)
echo "PyTorch (float64): loss $want"
failures=0
for g in "1 1x1x1x1" "4 2x1x2x1" "4 1x2x1x2"; do
    set -- $g
    out=$("$MPIEXEC" -np "$1" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" eval --grid "$2" \
        --checkpoint "$WORK/torch_model.bin" --data "$WORK/torch_tokens.bin" --batch 8 --seq 32 2>&1) ||
        { echo "$out"; exit 1; }
    got=$(echo "$out" | awk '/^loss/ { print $2 }')
    verdict=$(awk -v a="$got" -v b="$want" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d;
        printf "relative difference %.3g (tolerance 1e-5): %s", d, d <= 1e-5 ? "ok" : "FAILED" }')
    echo "fourfold eval on $2: loss $got, $verdict"
    case $verdict in *FAILED*) failures=$((failures + 1)) ;; esac
done
[ "$failures" = 0 ]
