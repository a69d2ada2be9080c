#!/bin/sh
# fourfold prune and train --mask (issue 28, docs/samo.md): a checkpoint
# pruned to 0.5 on 2 ranks, then to 0.8 from its mask (found beside it),
# the kept counts exact (round(p n) of the tiny model's 98304 candidate
# weights); masked training from it on 2x1x1x2 keeps every pruned weight of
# its checkpoint exactly zero (read by numpy from the llm.c file) while the
# kept weights move; bad input gets one message and the same exit on every
# rank (tests/cases.sh).
#   usage: prune_cli.sh FOURFOLD MPIEXEC
set -u
FF=$1 MPIEXEC=$2 NP=4
PY=/usr/bin/python3 # Debian's, with numpy
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
. "$(dirname "$0")/cases.sh"
MPI="$MPIEXEC --oversubscribe --mca mpi_yield_when_idle 1"
S="--model tiny --batch 8 --seq 16 --val-every 0"

step() { # name, command...: runs it, keeps its output in $WORK/$name.log
    name=$1
    shift
    if ! "$@" > "$WORK/$name.log" 2>&1; then
        echo "FAILED: $name: $*"
        cat "$WORK/$name.log"
        failures=$((failures + 1))
    fi
}
expect() { # file, text
    if grep -qF -- "$2" "$WORK/$1.log"; then
        echo "ok: $1: $2"
    else
        echo "FAILED: $1 lacks '$2':"
        cat "$WORK/$1.log"
        failures=$((failures + 1))
    fi
}

step run $MPI -np 1 "$FF" train $S --steps 3 --out "$WORK/run"
step p50 $MPI -np 2 "$FF" prune --grid 2x1x1x1 --checkpoint "$WORK/run/model_00000003.bin" \
    --sparsity 0.5 --out "$WORK/p50.bin"
expect p50 "pruned 49152 of 98304 candidate weights"
step p80 $MPI -np 1 "$FF" prune --checkpoint "$WORK/p50.bin" --sparsity 0.8 --out "$WORK/p80.bin"
expect p80 "starting from $WORK/p50.bin.mask: "
expect p80 "pruned 78643 of 98304 candidate weights"
step masked $MPI -np 4 "$FF" train $S --grid 2x1x1x2 --steps 3 --init-from "$WORK/p80.bin" \
    --mask auto --out "$WORK/m"
"$PY" - "$WORK/p80.bin" "$WORK/m/model_00000003.bin" <<'EOF' || failures=$((failures + 1))
import sys
import numpy as np
before = np.fromfile(sys.argv[1], dtype=np.float32, offset=1024)
after = np.fromfile(sys.argv[2], dtype=np.float32, offset=1024)
h = np.fromfile(sys.argv[1] + ".mask", dtype=np.int32, count=64)
n = int(h[2]) | int(h[3]) << 32
bits = np.fromfile(sys.argv[1] + ".mask", dtype=np.uint8, offset=256)
keep = np.unpackbits(bits, bitorder="little")[:n].astype(bool)
assert len(before) == len(after) == n, (len(before), len(after), n)
nonzero = int(np.count_nonzero(after[~keep]))
moved = int(np.count_nonzero(after[keep] != before[keep]))
print(f"masked training: {int((~keep).sum())} pruned weights, {nonzero} of them nonzero after 3 "
      f"steps; {moved} of {int(keep.sum())} kept entries changed")
sys.exit(0 if nonzero == 0 and moved > 0.5 * keep.sum() else 1)
EOF

# bad input: one message, every rank's exit code
case_ "expected 0 <= P < 1"              2 prune --checkpoint "$WORK/p80.bin" --sparsity 1 --out "$WORK/x.bin"
case_ "needs --checkpoint IN, --sparsity P and --out OUT" 2 prune --checkpoint "$WORK/p80.bin" --sparsity 0.5
case_ "missing.bin"                      1 prune --checkpoint "$WORK/missing.bin" --sparsity 0.5 --out "$WORK/x.bin"
step mini $MPI -np 1 "$FF" train --model mini --batch 8 --seq 16 --val-every 0 --steps 1 --out "$WORK/mini"
case_ "is the mask of another model"    1 train $S --grid 1x2x1x2 --steps 1 --init-from "$WORK/mini/model_00000001.bin" --mask "$WORK/p80.bin.mask" --out "$WORK/o1"
case_ "it needs init_from"               1 train $S --grid 1x2x1x2 --steps 1 --mask auto --out "$WORK/o2"
cp "$WORK/p80.bin.mask" "$WORK/bad.mask"
printf 'X' | dd of="$WORK/bad.mask" bs=1 seek=300 conv=notrunc 2> /dev/null
case_ "fails its checksum"               1 train $S --grid 1x2x1x2 --steps 1 --init-from "$WORK/p80.bin" --mask "$WORK/bad.mask" --out "$WORK/o3"
case_ "cannot read the mask"             1 train $S --grid 1x2x1x2 --steps 1 --init-from "$WORK/run/model_00000003.bin" --mask auto --out "$WORK/o4"

[ "$failures" = 0 ] && echo "prune_cli: passed" || echo "prune_cli: FAILED ($failures)"
[ "$failures" = 0 ]
