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
# --init-from: training starts from the PyTorch-written file; step 1's loss
# is the loss of the parameters before any update on the first window,
# which is the shard (8 x 32 + 1 tokens): PyTorch's number again. The grid
# is the planner's choice for that checkpoint's shape (--grid auto).
out=$("$MPIEXEC" -np 4 --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train --grid auto \
    --init-from "$WORK/torch_model.bin" --data "$WORK/torch_tokens.bin" --batch 8 --seq 32 \
    --steps 1 --val-every 0 --out "$WORK/run" 2>&1) || { echo "$out"; exit 1; }
grid=$(echo "$out" | awk -F'|' '/grid \(x y z d\)/ { print $3 }')
got=$(python3 -c "import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if r['type'] == 'step'][0]['loss'])" "$WORK/run/log.jsonl")
verdict=$(awk -v a="$got" -v b="$want" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d;
    printf "relative difference %.3g (tolerance 1e-5): %s", d, d <= 1e-5 ? "ok" : "FAILED" }')
echo "fourfold train --init-from, grid$grid: step-1 loss $got, $verdict"
case $verdict in *FAILED*) failures=$((failures + 1)) ;; esac
case $grid in *"--grid auto"*) ;; *) echo "FAILED: the table does not say the grid came from --grid auto"; failures=$((failures + 1)) ;; esac
[ "$failures" = 0 ]
