#!/bin/sh
# fourfold prune and train --mask (issue 28, docs/samo.md): a checkpoint
# pruned to 0.5 on 2 ranks, then to 0.8 from its mask (found beside it),
# the kept counts exact (round(p n) of the tiny model's 98304 candidate
# weights); masked training from it on 2x1x1x2 keeps every pruned weight of
# its checkpoint exactly zero (read by numpy from the llm.c file) while the
# kept weights move; iterative pruning inside a run, resumed bit for bit from
# a checkpoint that carries the mask, whose header records the pruned
# fraction; SAMO (--samo) writes the masked run's
# files bit for bit, in fp32 and in bf16-mixed, also resumed on the same
# grid (bf16-mixed too), on another grid and after iterative pruning; bad
# input gets one message and the same exit on every rank (tests/cases.sh).
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
# masked training from a pruned checkpoint: its pruned weights are zero in
# the file, and after 3 steps still (numpy reads both llm.c files)
check_masked() { # pruned checkpoint, trained checkpoint
    "$PY" - "$1" "$2" <<'EOF'
import sys
import numpy as np
before = np.fromfile(sys.argv[1], dtype=np.float32, offset=1024)
after = np.fromfile(sys.argv[2], dtype=np.float32, offset=1024)
h = np.fromfile(sys.argv[1] + ".mask", dtype=np.uint32, count=64)
n = int(h[2]) | int(h[3]) << 32
bits = np.fromfile(sys.argv[1] + ".mask", dtype=np.uint8, offset=256)
keep = np.unpackbits(bits, bitorder="little")[:n].astype(bool)
assert len(before) == len(after) == n, (len(before), len(after), n)
zero_before = int(np.count_nonzero(before[~keep]))
nonzero = int(np.count_nonzero(after[~keep]))
moved = int(np.count_nonzero(after[keep] != before[keep]))
print(f"masked training from {sys.argv[1].split('/')[-1]}: {int((~keep).sum())} pruned weights, "
      f"{zero_before} nonzero in the pruned file, {nonzero} after 3 steps; {moved} of "
      f"{int(keep.sum())} kept entries changed")
sys.exit(0 if zero_before == 0 and nonzero == 0 and moved > 0.9 * keep.sum() else 1)
EOF
}
step masked $MPI -np 4 "$FF" train $S --grid 2x1x1x2 --steps 3 --init-from "$WORK/p80.bin" \
    --mask auto --out "$WORK/m"
check_masked "$WORK/p80.bin" "$WORK/m/model_00000003.bin" || failures=$((failures + 1))
# the embedding pruned too, on 2 pipeline stages (the tied wte on both)
step p80e $MPI -np 1 "$FF" prune --checkpoint "$WORK/run/model_00000003.bin" --sparsity 0.8 \
    --embedding --out "$WORK/p80e.bin"
expect p80e "pruned 104858 of 131072 candidate weights"
step staged $MPI -np 4 "$FF" train $S --stages 2 --grid 1x1x1x2 --steps 3 \
    --init-from "$WORK/p80e.bin" --mask auto --out "$WORK/st"
check_masked "$WORK/p80e.bin" "$WORK/st/model_00000003.bin" || failures=$((failures + 1))

# iterative pruning in a run (0.75 in 2 rounds: 0.5 after step 2, 0.75 after
# step 4) on 1x2x1x2, checkpoints every 4 steps carrying the mask; resumed
# from step 4 it ends with the same model file, bit for bit (the mask came
# back from the checkpoint, or the pruned weights would have grown again)
P="$S --grid 1x2x1x2 --steps 8 --save-every 4 --keep 0 --prune-to 0.75 --prune-every 2 --prune-steps 2"
step iter $MPI -np 4 "$FF" train $P --out "$WORK/it"
expect iter "pruning round 1 of 2: 49152 of 98304 candidate weights pruned"
expect iter "pruning round 2 of 2: 73728 of 98304 candidate weights pruned"
mkdir "$WORK/it2"
for f in DONE_00000004 model_00000004.bin model_00000004.bin.mask state_00000004.bin log.jsonl; do
    cp "$WORK/it/$f" "$WORK/it2/"
done
cp -r "$WORK/it/corpus" "$WORK/it2/"
step iter2 $MPI -np 4 "$FF" train $P --out "$WORK/it2" --resume
if cmp -s "$WORK/it/model_00000008.bin" "$WORK/it2/model_00000008.bin" &&
    cmp -s "$WORK/it/model_00000008.bin.mask" "$WORK/it2/model_00000008.bin.mask"; then
    echo "ok: resumed at step 4, the pruning run's step-8 model and mask are bit for bit the same"
else
    echo "FAILED: the resumed pruning run differs at step 8"
    failures=$((failures + 1))
fi

# a run's mask file records what the mask tells of its options: the
# embedding pruned or not, and the pruned fraction of the candidates
mask_opts() { # mask file, embedding, pruned, candidates
    if "$PY" - "$@" <<'EOF'
import sys
import numpy as np
h = np.fromfile(sys.argv[1], dtype=np.int32, count=64)
want = np.float32(int(sys.argv[3]) / int(sys.argv[4]))
got = h[8:9].view(np.float32)[0]
print(f"{sys.argv[1].split('/')[-1]}: embedding {h[7]}, sparsity {got} (want {sys.argv[2]}, {want})")
sys.exit(0 if h[7] == int(sys.argv[2]) and got == want else 1)
EOF
    then echo "ok: the mask's header options"; else
        echo "FAILED: the mask's header options"
        failures=$((failures + 1))
    fi
}
mask_opts "$WORK/it/model_00000008.bin.mask" 0 73728 98304
mask_opts "$WORK/st/model_00000003.bin.mask" 1 104858 131072

# SAMO (--samo) from the pruned checkpoint on 1x1x2x2: the model and state
# files of every checkpoint bit for bit those of the masked run; resumed at
# step 2 on the same grid, step 4 bit for bit again; resumed at step 2 on
# 2x1x1x2, bit for bit the masked run resumed there (masked training across
# grids is checked against the serial run by test_prune); --prune-to with
# --samo switches after the last round and ends as the masked pruning run
Q="$S --steps 4 --save-every 2 --keep 0 --micro-batch 4 --init-from $WORK/p80.bin --mask auto"
step qm $MPI -np 4 "$FF" train $Q --grid 1x1x2x2 --out "$WORK/qm"
step qs $MPI -np 4 "$FF" train $Q --grid 1x1x2x2 --samo --out "$WORK/qs"
expect qs "SAMO from step 0: "
same_files() { # what, dir a, dir b, steps...
    what=$1 a=$2 b=$3
    shift 3
    for st in "$@"; do
        for f in model_0000000$st.bin state_0000000$st.bin model_0000000$st.bin.mask; do
            if ! cmp -s "$a/$f" "$b/$f"; then
                echo "FAILED: $what: $f differs"
                failures=$((failures + 1))
                return
            fi
        done
    done
    echo "ok: $what: the model, state and mask files bit for bit the same"
}
same_files "SAMO against masked on 1x1x2x2" "$WORK/qm" "$WORK/qs" 2 4
# in bf16-mixed too (the compressed fp32 master, the bf16 copy expanded from
# it: docs/samo.md), on the same products (emulated) in both runs
step qmb $MPI -np 4 "$FF" train $Q --grid 1x1x2x2 --precision bf16-mixed \
    --bf16-products emulated --out "$WORK/qmb"
step qsb $MPI -np 4 "$FF" train $Q --grid 1x1x2x2 --precision bf16-mixed \
    --bf16-products emulated --samo --out "$WORK/qsb"
expect qsb "the compressed fp32 master and the dense bf16 copy"
same_files "bf16-mixed SAMO against bf16-mixed masked on 1x1x2x2" "$WORK/qmb" "$WORK/qsb" 2 4
if cmp -s "$WORK/qm/model_00000004.bin" "$WORK/qmb/model_00000004.bin"; then
    echo "FAILED: the bf16-mixed masked run wrote the fp32 run's model"
    failures=$((failures + 1))
fi
for d in qs2 qs3 qm3 qsb2; do
    mkdir "$WORK/$d"
    src=$WORK/qs
    [ $d = qm3 ] && src=$WORK/qm
    [ $d = qsb2 ] && src=$WORK/qsb
    for f in DONE_00000002 model_00000002.bin model_00000002.bin.mask state_00000002.bin log.jsonl; do
        cp "$src/$f" "$WORK/$d/"
    done
    cp -r "$src/corpus" "$WORK/$d/"
done
R="$S --steps 4 --save-every 2 --keep 0 --micro-batch 4 --resume"
step qs2 $MPI -np 4 "$FF" train $R --grid 1x1x2x2 --samo --out "$WORK/qs2"
same_files "SAMO resumed at step 2 on 1x1x2x2" "$WORK/qs" "$WORK/qs2" 4
step qs3 $MPI -np 4 "$FF" train $R --grid 2x1x1x2 --samo --out "$WORK/qs3"
step qm3 $MPI -np 4 "$FF" train $R --grid 2x1x1x2 --out "$WORK/qm3"
same_files "SAMO and masked resumed at step 2 on 2x1x1x2" "$WORK/qm3" "$WORK/qs3" 4
step qsb2 $MPI -np 4 "$FF" train $R --grid 1x1x2x2 --precision bf16-mixed \
    --bf16-products emulated --samo --out "$WORK/qsb2"
same_files "bf16-mixed SAMO resumed at step 2 on 1x1x2x2" "$WORK/qsb" "$WORK/qsb2" 4
# a pruned checkpoint is an ordinary model file: eval and sample read it
step evs $MPI -np 2 "$FF" eval --grid 2x1x1x1 --checkpoint "$WORK/qs/model_00000004.bin" \
    --data "$WORK/run/corpus/fortunes_val.bin"
expect evs "(1 batches of 1 x 16 tokens, grid 2x1x1x1"
step sms $MPI -np 2 "$FF" sample --grid 1x1x1x2 --checkpoint "$WORK/qs/model_00000004.bin" --tokens 8
step iters $MPI -np 4 "$FF" train $P --samo --out "$WORK/its"
expect iters "SAMO from step 4: "
same_files "SAMO after iterative pruning" "$WORK/it" "$WORK/its" 4 8

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
case_ "go together"                      2 train $S --prune-to 0.5 --out "$WORK/o5"
case_ "SAMO needs a mask"                1 train $S --grid 1x2x1x2 --steps 1 --samo --out "$WORK/o6"
case_ "cannot read the mask"             1 train $S --grid 1x2x1x2 --steps 1 --init-from "$WORK/run/model_00000003.bin" --mask auto --out "$WORK/o4"

[ "$failures" = 0 ] && echo "prune_cli: passed" || echo "prune_cli: FAILED ($failures)"
[ "$failures" = 0 ]
