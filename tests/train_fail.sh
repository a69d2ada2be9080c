#!/bin/sh
# fourfold train, sample and eval fail cleanly: one message naming the
# problem, a non-zero exit on every rank, no hang; and a NaN stops the run
# keeping the last good checkpoint.
#   usage: train_fail.sh FOURFOLD MPIEXEC NP
set -u
FF=$1 MPIEXEC=$2 NP=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
CASE_TIMEOUT=120
. "$(dirname "$0")/cases.sh"

# a corpus with two documents per file, a small model
i=0
while [ $i -lt 300 ]; do
    echo "line $i of a small corpus for the failure tests, with some words in it"
    i=$((i + 1))
done > "$WORK/text"
"$FF" tokenize --out "$WORK/d" --val-fraction 0 "$WORK/text" > /dev/null
D="$WORK/d_train.bin"
S="--layers 2 --hidden 64 --heads 4 --seq 16 --batch 4 --steps 2 --val-every 0 --grid 1x2x2x1"

# a good run to resume from
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train $S --data "$D" \
    --out "$WORK/good" > "$WORK/good.out" 2>&1 || { cat "$WORK/good.out"; failures=1; }

# the step-1 update (lr 1e30) makes step 2's loss NaN: the checkpoint of
# step 1 holds the parameters that diverged, so no checkpoint is known good,
# and it is kept (nothing is written or removed after the NaN)
case_ "step 2: the loss is NaN"            1 train $S --steps 4 --data "$D" --lr 1e30 --clip 0 --save-every 1 --out "$WORK/nan"
if grep -q "the last good checkpoint: none" "$WORK/out" &&
    [ -e "$WORK/nan/DONE_00000001" ] && [ ! -e "$WORK/nan/DONE_00000002" ]; then
    echo "      the NaN run names no good checkpoint and left its checkpoint of step 1"
else
    echo "FAILED: the NaN run's checkpoint: $(ls "$WORK/nan")"
    failures=$((failures + 1))
fi
case_ "no file matches"                    1 train $S --data "$WORK/missing_*.bin" --out "$WORK/o"
head -c 2000 "$D" > "$WORK/short_train.bin"
case_ "short_train.bin"                    1 train $S --data "$WORK/short_train.bin" --out "$WORK/o"
case_ "has C=64, the model has C=96"       1 train $S --hidden 96 --data "$D" --out "$WORK/good" --resume
: > "$WORK/afile"
case_ "cannot create the output folder"    1 train $S --data "$D" --out "$WORK/afile/sub"
case_ "no complete checkpoint"             1 train $S --data "$D" --out "$WORK/empty" --resume
case_ "holds the checkpoints of another run" 1 train $S --data "$D" --out "$WORK/good"
case_ "is not a multiple of --micro-batch" 2 train $S --data "$D" --micro-batch 3 --out "$WORK/o"
case_ "vocabulary"                         1 train $S --vocab 100 --data "$D" --out "$WORK/o"

# corrupt checkpoints: one flipped byte in the model, then in the state
cp -r "$WORK/good" "$WORK/bad_model"
printf 'X' | dd of="$WORK/bad_model/model_00000002.bin" bs=1 seek=5000 conv=notrunc 2> /dev/null
case_ "fails its checksum"                 1 train $S --data "$D" --out "$WORK/bad_model" --resume
cp -r "$WORK/good" "$WORK/bad_state"
printf 'X' | dd of="$WORK/bad_state/state_00000002.bin" bs=1 seek=5000 conv=notrunc 2> /dev/null
case_ "fails its checksum"                 1 train $S --data "$D" --out "$WORK/bad_state" --resume
# a shape field of the header (NH, slot 5) changed: the CRC covers the header
cp "$WORK/good/model_00000002.bin" "$WORK/bad_header.bin"
printf '\002' | dd of="$WORK/bad_header.bin" bs=1 seek=20 conv=notrunc 2> /dev/null
case_ "fails its checksum"                 1 eval --grid 1x2x2x1 --checkpoint "$WORK/bad_header.bin" --data "$D" --seq 16
case_ "cannot open the checkpoint"         1 sample --grid 1x2x2x1 --checkpoint "$WORK/none.bin"
# a hostile header: L = 2^31-1 (slot 4, byte 16) or 3000 in a checkpoint of 2
# blocks. The header is checked against the file's size before any model of
# its shape is built (before: eval grew by 180 MB/s without end; L = 3000
# built a 150 M-parameter model before saying "truncated")
cp "$WORK/good/model_00000002.bin" "$WORK/huge_L.bin"
printf '\377\377\377\177' | dd of="$WORK/huge_L.bin" bs=1 seek=16 conv=notrunc 2> /dev/null
cp "$WORK/good/model_00000002.bin" "$WORK/big_L.bin"
printf '\270\013\000\000' | dd of="$WORK/big_L.bin" bs=1 seek=16 conv=notrunc 2> /dev/null
case_ "L=2147483647 NH=4 C=64 Vp=384) describes" 1 eval --grid 1x2x2x1 --checkpoint "$WORK/huge_L.bin" --data "$D" --seq 16
case_ "L=3000 NH=4 C=64 Vp=384) describes" 1 sample --grid 1x2x2x1 --checkpoint "$WORK/big_L.bin"
case_ "truncated, or a corrupt header"     1 train --seq 16 --batch 4 --steps 2 --grid 1x2x2x1 --data "$D" --init-from "$WORK/huge_L.bin" --out "$WORK/o"
# a FIFO where a file must be: refused at once, not waited on
mkfifo "$WORK/fifo.bin"
case_ "fifo.bin': not a regular file"      1 eval --grid 1x2x2x1 --checkpoint "$WORK/fifo.bin" --data "$D" --seq 16
case_ "fifo.bin': not a regular file"      1 train $S --data "$WORK/fifo.bin" --out "$WORK/o"
case_ "fifo.bin: not a regular file"       1 train $S --data "$D" --plan "$WORK/fifo.bin" --out "$WORK/o"
case_ "is truncated"                       1 eval --grid 1x2x2x1 --checkpoint "$WORK/good/model_00000002.bin" --data "$WORK/short_train.bin"

# options that the run would otherwise ignore in silence: refused
case_ "--layers 3, but --init-from"        2 train --layers 3 --hidden 64 --heads 4 --seq 16 --batch 4 --steps 2 --grid 1x2x2x1 --init-from "$WORK/good/model_00000002.bin" --data "$D" --out "$WORK/o"
case_ "--capacity-factor is for a model with experts" 1 eval --grid 1x2x2x1 --checkpoint "$WORK/good/model_00000002.bin" --data "$D" --seq 16 --capacity-factor 1.5
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" prune --grid 1x2x2x1 \
    --checkpoint "$WORK/good/model_00000002.bin" --sparsity 0.6 --out "$WORK/p60.bin" \
    > "$WORK/p60.out" 2>&1 || { cat "$WORK/p60.out"; failures=$((failures + 1)); }
case_ "already prunes"                     1 prune --grid 1x2x2x1 --checkpoint "$WORK/p60.bin" --sparsity 0.3 --out "$WORK/p30.bin"

# a stopped rank (SIGSTOP once the run has logged a step): with --timeout 3
# the rank that waits for it names the collective and aborts the job
cat > "$WORK/stop_rank1.sh" <<EOF
#!/bin/sh
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ]; then
    (until grep -q '"type":"step"' "$WORK/stopped/log.jsonl" 2> /dev/null; do sleep 0.1; done
     kill -STOP \$\$) &
fi
exec "\$@"
EOF
chmod +x "$WORK/stop_rank1.sh"
start=$(date +%s)
timeout 120 "$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$WORK/stop_rank1.sh" \
    "$FF" train $S --steps 100000 --data "$D" --timeout 3 --out "$WORK/stopped" > "$WORK/out" 2>&1
status=$?
msg=$(grep -m1 'waited .* for .* on group .*--timeout 3' "$WORK/out")
echo "a stopped rank with --timeout 3: exit $status after $(($(date +%s) - start)) s: $msg"
if [ "$status" = 0 ] || [ "$status" = 124 ] || [ -z "$msg" ]; then
    echo "FAILED: the job did not abort naming the collective"
    cat "$WORK/out"
    failures=$((failures + 1))
fi

# a message that fails inside the message-driven schedule, on one rank of a
# stage's tensor-parallel group (a test hook: FF_FAULT_PIPE_TEST=world rank):
# its peers learn it in the schedule's agreement, and the job aborts (the
# other stage would wait for its messages forever) instead of hanging
if [ "${FF_TEST_HOOKS:-0}" = 1 ]; then
    start=$(date +%s)
    FF_FAULT_PIPE_TEST=1 timeout 120 "$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 \
        "$FF" train $S --stages 2 --grid 2x1x1x1 --data "$D" --out "$WORK/pfault" > "$WORK/out" 2>&1
    status=$?
    msg=$(grep -m1 'FF_FAULT_PIPE_TEST.*aborting the job' "$WORK/out")
    echo "a failed receive in the schedule: exit $status after $(($(date +%s) - start)) s: $msg"
    if [ "$status" = 0 ] || [ "$status" = 124 ] || [ -z "$msg" ]; then
        echo "FAILED: the job did not stop with the failed receive's message"
        cat "$WORK/out"
        failures=$((failures + 1))
    fi
else
    echo "skipped: a failed receive in the schedule (no fault hooks in this build)"
fi

# one run per output folder: a second run into a folder in use is refused
# (flock on its .fourfold.lock), and the lock goes when the first run dies
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train $S --steps 100000 \
    --data "$D" --out "$WORK/busy" > "$WORK/busy.out" 2>&1 &
busy=$!
i=0
until grep -q '"type":"step"' "$WORK/busy/log.jsonl" 2> /dev/null || [ $i -ge 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
case_ "is in use by another run (process"  1 train $S --data "$D" --out "$WORK/busy" --overwrite
case_ "is in use by another run (process"  1 train $S --data "$D" --out "$WORK/busy" --resume
kill -9 $busy 2> /dev/null
pkill -9 -f "$WORK/busy" 2> /dev/null
wait $busy 2> /dev/null
# a resume passes over a checkpoint whose state is corrupt for the one
# before it, saying so, and continues exactly as a resume from that one
# (a masked run: nothing of the bad checkpoint, its mask included, may
# stay in the model)
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train $S --save-every 1 \
    --prune-to 0.5 --prune-every 2 --prune-steps 1 --data "$D" --out "$WORK/two" \
    > "$WORK/two.out" 2>&1 || { cat "$WORK/two.out"; failures=$((failures + 1)); }
cp -r "$WORK/two" "$WORK/one"
rm "$WORK/one/DONE_00000002"
printf 'X' | dd of="$WORK/two/state_00000002.bin" bs=1 seek=5000 conv=notrunc 2> /dev/null
for run in two one; do
    "$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train $S --steps 3 \
        --prune-to 0.5 --prune-every 2 --prune-steps 1 --data "$D" --out "$WORK/$run" --resume \
        > "$WORK/$run.resume" 2>&1 || echo "exit $? ($run)" >> "$WORK/$run.resume"
done
l_two=$(grep '"step":3,' "$WORK/two/log.jsonl" | grep -o '"loss":[^,]*')
l_one=$(grep '"step":3,' "$WORK/one/log.jsonl" | grep -o '"loss":[^,]*')
if grep -q "passing over the checkpoint of step 2 (.*fails its checksum" "$WORK/two.resume" &&
    grep -q "resumed from step 1" "$WORK/two.resume" && [ -n "$l_two" ] && [ "$l_two" = "$l_one" ]; then
    echo "a corrupt newest checkpoint: passed over for step 1's; step 3 $l_two, as resumed from step 1"
else
    echo "FAILED: the resume past a corrupt checkpoint: step 3 $l_two, from step 1 $l_one"
    cat "$WORK/two.resume" "$WORK/one.resume"
    failures=$((failures + 1))
fi
# a token outside the vocabulary in the validation data fails the final
# validation, after the final checkpoint is written (--save-every 0)
python3 -c 'import struct, sys
h = [20240520, 1, 4096] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *h) + struct.pack("<4096H", *([300] * 4096)))' \
    "$WORK/bad_val.bin"
case_ "bad_val.bin"                        1 train $S --val-every 0 --data "$D" --val-data "$WORK/bad_val.bin" --out "$WORK/badval"
if [ -e "$WORK/badval/DONE_00000002" ]; then
    echo "      the final checkpoint was written before the failing validation"
else
    echo "FAILED: the failing final validation lost the run: $(ls "$WORK/badval")"
    failures=$((failures + 1))
fi

# per-layer plans (--plan): for this model and grid it runs (searched for
# another progress mode: noted once); for another grid or model, missing or
# corrupt, one message before anything runs
P="--layers 2 --hidden 64 --heads 4 --vocab 257 --seq 16 --batch 4"
"$FF" plan $P --grid 1x2x2x1 --per-layer --progress thread --out "$WORK/plan.json" > /dev/null
"$FF" plan $P --grid 2x1x2x1 --per-layer --out "$WORK/plan_grid.json" > /dev/null
"$FF" plan --layers 2 --hidden 128 --heads 4 --vocab 257 --seq 16 --batch 4 --grid 1x2x2x1 \
    --per-layer --out "$WORK/plan_model.json" > /dev/null
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train $S --data "$D" \
    --plan "$WORK/plan.json" --out "$WORK/planned" > "$WORK/planned.out" 2>&1 &&
    grep -q "per-layer plan" "$WORK/planned.out" &&
    [ "$(grep -c "was searched for --progress thread; this run uses --progress poll" "$WORK/planned.out")" = 1 ] &&
    echo "      a plan for this model and grid runs, its progress mode noted once" ||
    { cat "$WORK/planned.out"; echo "FAILED: a plan for this model and grid"; failures=$((failures + 1)); }
case_ "grid 2x1x2x1"                       1 train $S --data "$D" --plan "$WORK/plan_grid.json" --out "$WORK/o"
case_ "hidden=128"                         1 train $S --data "$D" --plan "$WORK/plan_model.json" --out "$WORK/o"
case_ "missing.json"                       1 train $S --data "$D" --plan "$WORK/missing.json" --out "$WORK/o"
head -c 100 "$WORK/plan.json" > "$WORK/plan_cut.json"
case_ "plan_cut.json"                      1 train $S --data "$D" --plan "$WORK/plan_cut.json" --out "$WORK/o"
case_ "--decompose 65"                     2 train $S --data "$D" --decompose 65 --out "$WORK/o"

# pipeline stages (--stages P, after S, so a later --grid gives the grid of
# one stage): a stage count that does not divide the job, more stages than
# blocks (the model's L from the options, then from a checkpoint), a split
# that does not add up to L, a slow stage that does not exist: one message
# before any step (exit 1); options that cannot be right whatever the model
# is: usage errors (exit 2)
case_ "does not divide the job's 4 ranks"  1 train $S --data "$D" --stages 3 --out "$WORK/o"
case_ "but each of the 2 stages has 2"     1 train $S --data "$D" --stages 2 --out "$WORK/o"
case_ "4 pipeline stages for 2 blocks"     1 train $S --data "$D" --stages 4 --grid serial --out "$WORK/o"
case_ "4 pipeline stages for 2 blocks"     1 eval --grid serial --stages 4 --checkpoint "$WORK/good/model_00000002.bin" --data "$D" --seq 16
case_ "add up to 3, but the model has L=2" 1 train $S --data "$D" --stages 2 --grid 1x2x1x1 --stage-layers 1,2 --out "$WORK/o"
case_ "slow stage 5 of 2"                  1 train $S --data "$D" --stages 2 --grid 1x2x1x1 --slow-stage 5 --slow-ms 1 --out "$WORK/o"
case_ "gives 1 stages, but --stages is 2"  2 train $S --data "$D" --stages 2 --grid 1x2x1x1 --stage-layers 1 --out "$WORK/o"
case_ "--stage-layers 0,2: expected"       2 train $S --data "$D" --stages 2 --grid 1x2x1x1 --stage-layers 0,2 --out "$WORK/o"
case_ "--micro-batches 0: expected an integer from 1" 2 train $S --data "$D" --micro-batches 0 --out "$WORK/o"
case_ "is not a multiple of --micro-batches 3" 2 train $S --data "$D" --micro-batches 3 --out "$WORK/o"
case_ "--schedule foo: expected message or 1f1b" 2 train $S --data "$D" --schedule foo --out "$WORK/o"
case_ "--slow-ms needs --slow-stage"       2 train $S --data "$D" --slow-ms 5 --out "$WORK/o"
case_ "--grid auto: 4 ranks do not split into 3 stages" 1 train $S --data "$D" --grid auto --stages 3 --out "$WORK/o"

# mixture of experts (docs/moe.md): options out of range, and dense and MoE
# checkpoints given to the other kind of model
M="--experts 4 --expert-every 2"
case_ "--router-top-k 3: expected an integer from 1 to 2" 2 train $S $M --router-top-k 3 --data "$D" --out "$WORK/o"
case_ "--cac on needs --checkpoint on"     2 train $S --cac on --data "$D" --out "$WORK/o"
case_ "top-2 routing with 1 expert:"       1 train $S --experts 1 --router-top-k 2 --data "$D" --out "$WORK/o"
case_ "is a dense model (llm.c v3), the model has 4 experts" 1 train $S $M --data "$D" --out "$WORK/good" --resume
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train $S $M --data "$D" \
    --out "$WORK/moe" > "$WORK/moe.out" 2>&1 || { cat "$WORK/moe.out"; failures=$((failures + 1)); }
case_ "is a mixture of experts (4 experts), the model is dense" 1 train $S --data "$D" --out "$WORK/moe" --resume
case_ "has experts=4, the model has experts=2" 1 train $S --experts 2 --data "$D" --out "$WORK/moe" --resume
case_ "does not model a mixture of experts with pipeline stages" 1 train $S $M --data "$D" --grid auto --stages 2 --out "$WORK/o"
case_ "--balanced-routing need a model with experts" 2 train $S --balanced-routing on --data "$D" --out "$WORK/o"
case_ "expert parallelism 4 does not divide the data-parallel size Gd=1" 1 train $S $M --expert-parallel 4 --data "$D" --out "$WORK/o"
case_ "need a model with experts"          2 train $S --expert-parallel 2 --data "$D" --out "$WORK/o"
case_ "is a dense model: the mixture-of-experts options need" 2 train $S --init-from "$WORK/good/model_00000002.bin" --router-top-k 2 --data "$D" --out "$WORK/o"
case_ "expert parallelism 4 does not divide the 2 experts" 1 train $S --experts 2 --expert-parallel 4 --grid 1x1x1x4 --data "$D" --out "$WORK/o"

echo "train_fail: $failures failures"
[ "$failures" = 0 ]
