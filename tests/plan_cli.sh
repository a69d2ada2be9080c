#!/bin/sh
# fourfold plan from a plain shell (no mpirun): bad input gives one message
# and a non-zero exit; good input prints the table, the detail of one grid,
# the rejected grids and JSON; a profile written by --print-machine reads
# back to the same plan; --per-layer writes a plan for the best grid that
# --plan evaluates to the same prediction and refuses for another model or
# grid; under mpirun only one process prints.
#   usage: plan_cli.sh FOURFOLD MPIEXEC
set -u
FF=$1 MPIEXEC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
GPT20="--model gpt-20b --ranks 1024 --ranks-per-node 4 --batch 1024 --seq 2048 --machine perlmutter"

fail() { echo "FAILED: $*"; failures=$((failures + 1)); }

# bad: expected-exit expected-substring args...
bad() {
    code=$1 want=$2
    shift 2
    "$FF" plan "$@" > "$WORK/out" 2> "$WORK/err"
    rc=$?
    n=$(grep -c '^fourfold: error:' "$WORK/err")
    msg=$(head -1 "$WORK/err")
    if [ "$rc" != "$code" ]; then fail "plan $*: exit $rc, want $code ($msg)"
    elif [ "$n" != 1 ] || [ "$(wc -l < "$WORK/err")" != 1 ]; then fail "plan $*: $n error lines"; cat "$WORK/err"
    elif ! echo "$msg" | grep -qF -- "$want"; then fail "plan $*: '$msg' lacks '$want'"
    elif [ -s "$WORK/out" ]; then fail "plan $*: printed to stdout on error"
    else printf 'ok  exit %s  %-60s %s\n' "$code" "$*" "$msg"
    fi
}

bad 2 "unknown model 'gpt-99b'"                 --model gpt-99b --ranks 8
bad 2 "--ranks 0: expected an integer from 1"     --model gpt2 --ranks 0
bad 2 "--batch -4: expected an integer"           --model gpt2 --batch -4
bad 2 "needs --model NAME"                        --ranks 8
bad 2 "--layers x: expected an integer"           --layers x --hidden 64 --heads 4
bad 2 "not divisible by the 5 heads"              --layers 2 --hidden 64 --heads 5
bad 2 "unknown option --rnaks"                    --model gpt2 --rnaks 8
bad 2 "unexpected argument 'extra'"               --model gpt2 extra
bad 2 "option --ranks needs a value"              --model gpt2 --ranks
bad 2 "--cost foo: expected full, paper, axonn"   --model gpt2 --cost foo
bad 2 "--checkpoint maybe: expected on, off"      --model gpt2 --checkpoint maybe
bad 2 "--cmm maybe: expected on or off"           --model gpt2 --cmm maybe
bad 2 "--rs-cmm maybe: expected on or off"        --model gpt2 --rs-cmm maybe
bad 2 "--precision fp16: expected fp32, bf16-mixed or auto" --model gpt2 --precision fp16
bad 2 "bf16-mixed precision needs the full cost model" --model gpt2 --precision bf16-mixed --cost paper
bad 2 "--wire fp16: expected fp32 or bf16"        --model gpt2 --wire fp16
bad 2 "'oak' is not one of oar, ors, oag, dp"      --model gpt2 --overlap oar,oak
bad 2 "--memory 40XB: expected a size"            --model gpt2 --memory 40XB
bad 2 "exceeds the 1024 positions of model gpt2"  --model gpt2 --seq 2048
bad 2 "needs 16 ranks, but the job has 8"         --model gpt2 --ranks 8 --grid 2x2x2x2
bad 2 "give four sizes such as 2x2x4x8"           --model gpt2 --grid fsdp
bad 2 "unknown machine 'summit'"                  --model gpt2 --machine summit
bad 1 "cannot open"                               --model gpt2 --machine "$WORK/none.json"
printf '{"format": "fourfold-profile", "version": 1,\n "ranks_per_node": 2,\n' > "$WORK/cut.json"
bad 1 "cut.json: line 3: expected a string, found the end of the file" \
    --model gpt2 --machine "$WORK/cut.json"

# good: the README's planning command
"$FF" plan $GPT20 > "$WORK/table" 2> "$WORK/err" || fail "plan gpt-20b: exit $?"
[ -s "$WORK/err" ] && fail "plan gpt-20b wrote to stderr: $(cat "$WORK/err")"
rows=$(grep -cE '^ +[0-9]+ [0-9]+x[0-9]+x[0-9]+x[0-9]+ ' "$WORK/table")
[ "$rows" = 10 ] || fail "plan gpt-20b: $rows table rows, want 10"
grep -q "286 grids of 1024 ranks" "$WORK/table" || fail "plan gpt-20b: no '286 grids' line"
head -5 "$WORK/table"
sed -n '7p' "$WORK/table"

# one grid in detail, and a rejected one
"$FF" plan $GPT20 --grid 4x1x16x16 > "$WORK/detail" || fail "--grid: exit $?"
grep -q "step .* = compute .* + exposed communication" "$WORK/detail" || fail "--grid: no step line"
grep -q "Z     all-gather" "$WORK/detail" || fail "--grid: no Z all-gather row"
# (a rejected grid: its detail printed, the reason on stderr once, exit 1)
"$FF" plan $GPT20 --grid 3x1x1x1 --ranks 3 > "$WORK/detail" 2> "$WORK/err"
rc=$?
[ "$rc" = 1 ] || fail "--grid 3x1x1x1 (rejected): exit $rc, expected 1"
[ "$(grep -c 'fourfold: error: grid 3x1x1x1 cannot run this job: hidden size 7168' "$WORK/err")" = 1 ] ||
    fail "--grid 3x1x1x1: stderr $(cat "$WORK/err")"
grep -q "rejected: hidden size 7168 does not divide over Gx = 3" "$WORK/detail" ||
    fail "--grid 3x1x1x1: $(cat "$WORK/detail")"

# --rejected lists every grid that did not fit, with its reason
"$FF" plan --model gpt2 --ranks 8 --batch 8 --seq 256 --rejected > "$WORK/rej" || fail "--rejected: exit $?"
grep -q "8x1x1x1 .*the 12 heads do not divide over Gx = 8" "$WORK/rej" || fail "--rejected: $(tail -3 "$WORK/rej")"

# the other cost models
"$FF" plan $GPT20 --cost paper --top 3 > "$WORK/paper" || fail "--cost paper: exit $?"
grep -q "AG Z 5.1" "$WORK/paper" || fail "--cost paper: no table"
"$FF" plan --model gpt-20b --ranks 32 --batch 16 --seq 2048 --machine perlmutter --cost axonn \
    > "$WORK/axonn" || fail "--cost axonn: exit $?"
grep -q "56 grids, " "$WORK/axonn" || fail "--cost axonn: not the tool's 56 grids"
"$FF" plan --model gpt-20b --ranks 24 --batch 16 --seq 2048 --machine perlmutter --cost axonn \
    > "$WORK/axonn24" || fail "--cost axonn on 24 ranks: exit $?"
grep -q "no grid fits" "$WORK/axonn24" || fail "--cost axonn on 24 ranks: a grid?"

# JSON: valid, one entry per grid
"$FF" plan --model gpt2 --ranks 8 --batch 8 --seq 256 --json > "$WORK/plan.json" || fail "--json: exit $?"
if command -v python3 > /dev/null; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["grids"]) == 20, len(d["grids"]); assert d["format"] == "fourfold-plan"' \
        "$WORK/plan.json" || fail "--json: not valid JSON with 20 grids"
fi

# a preset written as a profile file gives the same plan
"$FF" plan --machine perlmutter --print-machine > "$WORK/perl.json" || fail "--print-machine: exit $?"
"$FF" plan $GPT20 --machine "$WORK/perl.json" > "$WORK/table2" || fail "plan from file: exit $?"
if ! diff "$WORK/table" "$WORK/table2" > "$WORK/diff"; then
    # only the header's machine line may differ (none expected)
    fail "plan from the profile file differs: $(head -5 "$WORK/diff")"
fi

# per-layer plans: refusals
GPT2="--model gpt2 --ranks 8 --batch 8 --seq 256"
bad 2 "--search foo: expected descent or mh"      $GPT2 --per-layer --search foo
bad 2 "--search needs --per-layer"                $GPT2 --search mh
bad 2 "--out needs --per-layer"                   $GPT2 --out "$WORK/lp.json"
bad 2 "per-layer plans need the full cost model"  $GPT2 --per-layer --cost paper
bad 2 "give one of them"                          $GPT2 --per-layer --plan "$WORK/lp.json"
bad 2 "grid 8x1x1x1: the 12 heads do not divide" $GPT2 --grid 8x1x1x1 --per-layer
bad 1 "--out: cannot write $WORK/none/lp.json"    $GPT2 --per-layer --out "$WORK/none/lp.json"
bad 1 "cannot open plan $WORK/none.json"          $GPT2 --plan "$WORK/none.json"
printf '{"format": "fourfold-layer-plan", "version": 4}\n' > "$WORK/v4.json"
bad 1 "v4.json: version 4 is not supported"       $GPT2 --plan "$WORK/v4.json"

# --per-layer without --grid: the ranking's best grid; the plan is written
"$FF" plan $GPT2 --per-layer --out "$WORK/lp.json" > "$WORK/lp.txt" 2> "$WORK/err" ||
    fail "--per-layer: exit $? ($(cat "$WORK/err"))"
"$FF" plan $GPT2 > "$WORK/table8" || fail "plan gpt2: exit $?"
best=$(grep -E '^ +1 [0-9]+x' "$WORK/table8" | awk '{print $2}')
grep -q "^per-layer plan (coordinate descent) for grid $best:" "$WORK/lp.txt" ||
    fail "--per-layer did not plan the best grid $best: $(grep '^per-layer' "$WORK/lp.txt")"
rows=$(grep -cE '^ +(qkv|attproj|fc|fcproj) ' "$WORK/lp.txt")
rows=$((rows + $(grep -cE '^ +[0-9]+ +(on|off) +qkv ' "$WORK/lp.txt")))
[ "$rows" = 48 ] || fail "--per-layer: $rows layer rows, want 48 (12 blocks x 4)"
grep -q "^wrote $WORK/lp.json" "$WORK/lp.txt" || fail "--per-layer: no 'wrote' line"
[ -z "$(ls "$WORK" | grep '\.tmp\.')" ] || fail "--per-layer left a temporary file"
searched=$(sed -n 's/^predicted step: uniform configuration \(.*\), per-layer plan \(.*\) (.*/\1 \2/p' "$WORK/lp.txt")
[ -n "$searched" ] || fail "--per-layer: no 'predicted step' line"
echo "ok  --per-layer on $best: uniform, plan: $searched"
if command -v python3 > /dev/null; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["format"] == "fourfold-layer-plan" and d["version"] == 2 and d["progress"] == "poll" and len(d["blocks"]) == 12 and d["model"]["layers"] == 12, d' \
        "$WORK/lp.json" || fail "--out: not a plan of 12 blocks"
fi

# --plan evaluates it: the same prediction, on its grid (given or not)
"$FF" plan $GPT2 --plan "$WORK/lp.json" > "$WORK/eval.txt" 2> "$WORK/err" ||
    fail "--plan: exit $? ($(cat "$WORK/err"))"
evaluated=$(sed -n 's/^predicted step: uniform configuration \(.*\), per-layer plan \(.*\) (.*/\1 \2/p' "$WORK/eval.txt")
[ "$evaluated" = "$searched" ] || fail "--plan predicts '$evaluated', the search '$searched'"
"$FF" plan $GPT2 --grid "$best" --plan "$WORK/lp.json" > "$WORK/eval2.txt" ||
    fail "--plan --grid $best: exit $?"
cmp -s "$WORK/eval.txt" "$WORK/eval2.txt" || fail "--plan with and without its --grid differ"
grep -q "per-layer plan: activation checkpointing in" "$WORK/eval.txt" || fail "--plan: no detail"
# a plan searched for another progress mode: evaluated in its mode unless
# --progress is given (then noted)
"$FF" plan $GPT2 --grid "$best" --per-layer --progress thread --out "$WORK/lpt.json" > "$WORK/lpt.txt" ||
    fail "--per-layer --progress thread: exit $?"
searched_t=$(sed -n 's/^predicted step: uniform configuration \(.*\), per-layer plan \(.*\) (.*/\1 \2/p' "$WORK/lpt.txt")
"$FF" plan $GPT2 --plan "$WORK/lpt.json" > "$WORK/evalt.txt" || fail "--plan (thread): exit $?"
evaluated_t=$(sed -n 's/^predicted step: uniform configuration \(.*\), per-layer plan \(.*\) (.*/\1 \2/p' "$WORK/evalt.txt")
[ "$evaluated_t" = "$searched_t" ] || fail "--plan of a thread plan predicts '$evaluated_t', its search '$searched_t'"
! grep -q "^note:" "$WORK/evalt.txt" || fail "--plan in the plan's own mode printed a note"
"$FF" plan $GPT2 --plan "$WORK/lpt.json" --progress poll > "$WORK/evalp.txt" || fail "--plan --progress poll: exit $?"
grep -q "^note: the plan was searched for --progress thread; evaluated with --progress poll" "$WORK/evalp.txt" ||
    fail "--plan --progress poll of a thread plan: no note"
grep -q "^progress mode thread (the plan's)" "$WORK/evalt.txt" || fail "--plan: its mode not printed"
grep -q "^wrote $WORK/lpt.json (fourfold train --grid $best --plan $WORK/lpt.json --progress thread)" \
    "$WORK/lpt.txt" || fail "--out of a thread plan: the train line lacks --progress thread"
"$FF" plan $GPT2 --plan "$WORK/lpt.json" --progress poll --json > "$WORK/evalp.json" ||
    fail "--plan --progress poll --json: exit $?"
if command -v python3 > /dev/null; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["progress"] == "poll" and d["layer_plan"]["progress"] == "thread", d["progress"]' \
        "$WORK/evalp.json" || fail "--plan --progress poll --json: not JSON, or the modes wrong"
fi
sed -e 's/"version": 2/"version": 1/' -e 's/"progress": "poll", //' "$WORK/lp.json" > "$WORK/lp1.json"
"$FF" plan $GPT2 --plan "$WORK/lp1.json" > "$WORK/eval1.txt" || fail "--plan of a version 1 file: exit $?"
grep -q "^progress mode poll (the plan does not record one)" "$WORK/eval1.txt" ||
    fail "--plan of a version 1 file: $(grep -m1 progress "$WORK/eval1.txt")"
echo "ok  a plan searched with --progress thread is evaluated in that mode ($evaluated_t), noted when not"
other=2x2x2x1
[ "$best" = 2x2x2x1 ] && other=1x2x2x2
bad 2 "the plan is for grid $best; this run has grid $other" $GPT2 --grid $other --plan "$WORK/lp.json"
bad 2 "the plan is for layers=12 hidden=768; this run has layers=2 hidden=64" \
    --model gpt2 --layers 2 --hidden 64 --ranks 8 --batch 8 --seq 256 --plan "$WORK/lp.json"
"$FF" plan $GPT2 --plan "$WORK/lp.json" --json > "$WORK/eval.json" || fail "--plan --json: exit $?"
if command -v python3 > /dev/null; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["layer_plan"]["format"] == "fourfold-layer-plan" and d["grids"][0]["step_s"] <= d["uniform"]["step_s"], d["grids"][0]["step_s"]' \
        "$WORK/eval.json" || fail "--plan --json: not the plan and its evaluation"
fi

# Metropolis-Hastings: the same file from the same seed
"$FF" plan $GPT2 --grid "$best" --per-layer --search mh --seed 3 --out "$WORK/mh1.json" > /dev/null &&
    "$FF" plan $GPT2 --grid "$best" --per-layer --search mh --seed 3 --out "$WORK/mh2.json" > /dev/null ||
    fail "--search mh: exit $?"
cmp -s "$WORK/mh1.json" "$WORK/mh2.json" || fail "--search mh: two runs with one seed differ"

# pipeline stages (issue 26): bad input, the ranking of (grid, P, M), one stage's grid in detail
bad 2 "8 ranks do not split into 3 stages"         --model mini --ranks 8 --stages 3
bad 2 "--grid with --stages auto"                  --model mini --stages auto --grid 1x1x2x1
bad 2 "the stages' blocks add up to 5, but the model has L=4" --model mini --ranks 4 --stages 2 --stage-layers 3,2
bad 2 "--stage-layers 3,x: expected the blocks"     --model mini --stages 2 --stage-layers 3,x
bad 2 "the AG cache holds every block or none"      --model mini --ranks 4 --stages 2 --ag-cache 2
bad 2 "need the full cost model, not paper"        --model mini --ranks 4 --stages 2 --cost paper
bad 2 "--stages: give the job's --ranks"           --model mini --stages 2
bad 2 "--stages 0: expected a number from 1 to 1048576, or auto" --model mini --stages 0
bad 2 "--schedule fast: expected message or 1f1b"  --model mini --schedule fast
PIPE="--model mini --layers 8 --batch 16 --seq 64 --ranks 8 --checkpoint off"
"$FF" plan $PIPE --stages auto --micro-batches auto --top 100 > "$WORK/pipe" 2> "$WORK/err" ||
    fail "plan --stages auto: exit $?: $(cat "$WORK/err")"
for P in 1 2 4 8; do # every P dividing 8 ranks with a block each, ranked together
    grep -qE "^ +[0-9]+ [0-9x]+ P$P M[0-9]+ " "$WORK/pipe" || fail "--stages auto: no row with P$P"
done
grep -q "35 grids of the stages of 8 ranks" "$WORK/pipe" || fail "--stages auto: not 20+10+4+1 grids"
bad 2 "each of the 2 stages has 4"                 $PIPE --stages 2 --grid 1x1x2x1
"$FF" plan $PIPE --ranks 4 --stages 2 --micro-batches 4 --grid 1x1x2x1 > "$WORK/pipe1" 2> "$WORK/err" ||
    fail "plan --stages 2 --grid: exit $?: $(cat "$WORK/err")"
grep -q "pipeline: 2 stages of 2 ranks (4 in all), message-driven" "$WORK/pipe1" ||
    fail "--stages 2 --grid 1x1x2x1: no pipeline line"
grep -q "(the bubble)" "$WORK/pipe1" || fail "--stages 2 --grid 1x1x2x1: no bubble"
if command -v python3 > /dev/null; then
    "$FF" plan $PIPE --stages 4 --micro-batches 8 --json > "$WORK/pipe.json" ||
        fail "plan --stages 4 --json: exit $?"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); g=d["grids"]; assert d["stages"] == 4 and len(g) == 4 and all(r["stages"] == 4 and r["micro_batches"] == 8 and r["p2p"]["calls"] > 0 for r in g if not r["rejected"]), g' \
        "$WORK/pipe.json" || fail "--stages 4 --json: not 4 grids of 2 ranks with their messages"
fi

# a mixture of experts (issue 27): bad input, grids x expert parallelism
# ranked (every Ge dividing Gd and E), one grid with its expert groups
bad 2 "need a model with experts"                  --model mini --ranks 8 --expert-parallel 2
bad 2 "top-2 routing with 1 experts"               --model mini --experts 1 --router-top-k 2
bad 2 "--capacity-factor 0: expected a number above 0" --model mini-moe --capacity-factor 0
bad 2 "the planner does not model a mixture of experts with pipeline stages" \
    --model mini-moe --ranks 4 --stages 2
bad 2 "a mixture of experts needs the full cost model" --model mini-moe --ranks 4 --cost paper
bad 2 "--dtd maybe: expected on or off"            --model mini-moe --dtd maybe
MOE="--model mini-moe --ranks 8 --batch 16 --seq 128"
"$FF" plan $MOE --top 100 --rejected > "$WORK/moe" 2> "$WORK/err" ||
    fail "plan mini-moe: exit $?: $(cat "$WORK/err")"
# every grid with Ge = 1, those with Gd = 2 or 4 also with Ge = 2, those with
# Gd = 4 with Ge = 4; none with 8 (E = 4)
grep -q "^experts: 4 in every 2nd block, top-1, capacity factor 1.25; expert parallelism auto" \
    "$WORK/moe" || fail "plan mini-moe: no experts line"
for ge in 1 2 4; do
    grep -qE "^ +[0-9]+ [0-9x]+ EP$ge " "$WORK/moe" || fail "plan mini-moe: no row with EP$ge"
done
grep -qE " EP8 " "$WORK/moe" && fail "plan mini-moe: Ge = 8 does not divide 4 experts"
"$FF" plan $MOE --grid 2x1x1x4 --expert-parallel 4 > "$WORK/moe1" 2> "$WORK/err" ||
    fail "plan mini-moe --grid: exit $?: $(cat "$WORK/err")"
grep -q "expert parallelism 4 (1 expert per rank)" "$WORK/moe1" || fail "--grid: no expert line"
grep -qE "^  EP +all-to-all " "$WORK/moe1" || fail "--grid 2x1x1x4 EP4: no EP all-to-all row"
grep -qE "^  X +all-gather " "$WORK/moe1" || fail "--grid 2x1x1x4 EP4: no DTD all-gather over X"
"$FF" plan $MOE --grid 2x1x1x4 --expert-parallel 3 > "$WORK/moe3" 2> /dev/null &&
    fail "--expert-parallel 3: a rejected grid exits 0"
grep -q "rejected: expert parallelism 3 does not divide Gd = 4" "$WORK/moe3" ||
    fail "--expert-parallel 3 on Gd = 4: $(tail -1 "$WORK/moe3")"
# DTD on Gx = 2: each all-to-all of tokens carries half the rows (the 2 MoE
# blocks' 2 count exchanges of 1 float to 3 ranks, 24 B, are the same)
if command -v python3 > /dev/null; then
    for dtd in on off; do
        "$FF" plan $MOE --grid 2x1x1x4 --expert-parallel 4 --dtd $dtd --json > "$WORK/dtd-$dtd.json" ||
            fail "--dtd $dtd --json: exit $?"
    done
    python3 -c 'import json,sys
def a2a(f): return [c["bytes_sent"] for c in json.load(open(f))["grids"][0]["collectives"] if c["group"] == "EP" and c["collective"] == "alltoall"][0]
on, off = a2a(sys.argv[1]), a2a(sys.argv[2])
assert off - 24 == 2 * (on - 24), (on, off)
print("ok  DTD on Gx = 2: EP all-to-all %d B sent, without %d B" % (on, off))' \
        "$WORK/dtd-on.json" "$WORK/dtd-off.json" || fail "--dtd: the all-to-all bytes do not halve"
fi

# --explain: the first choice's time budget, whose parts add up to the step
"$FF" plan --model tiny --ranks 4 --batch 8 --seq 64 --explain > "$WORK/explain" 2> "$WORK/err" ||
    fail "plan --explain: exit $?: $(cat "$WORK/err")"
grep -q "time budget of a step" "$WORK/explain" || fail "--explain: no time budget"
sum=$(awk '/time budget of a step/ {on = 1; next} on && $1 != "step" {
    for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+%$/) {sub("%", "", $i); s += $i; break}}
    END {print s}' "$WORK/explain")
awk -v s="$sum" 'BEGIN {exit !(s > 99.5 && s < 100.5)}' ||
    fail "--explain: the parts add up to $sum% of the step"

# ZeRO over D (issue 52): GPT-2 124M on Gd = 4 in 1.5 GiB fits only with
# --zero 1 (moments 8 (n - nz) + 8 x the largest chunk of each bucket);
# the D traffic becomes the all-reduce's two halves, the same bytes
Z124="--model gpt2-124m --batch 4 --seq 64 --grid 1x1x1x4 --memory 1.5GiB --checkpoint off"
"$FF" plan $Z124 > "$WORK/z0" 2>&1 && fail "--zero 0 in 1.5 GiB: exit 0"
grep -q "rejected: needs 1.9 GiB per rank" "$WORK/z0" || fail "--zero 0: $(tail -1 "$WORK/z0")"
"$FF" plan $Z124 --zero 1 > "$WORK/z1" 2>&1 || fail "--zero 1 in 1.5 GiB: exit $?: $(tail -1 "$WORK/z1")"
grep -q "AdamW moments 242.6 MiB" "$WORK/z1" || fail "--zero 1: $(grep 'memory per' "$WORK/z1")"
"$FF" plan $Z124 --memory 12GiB > "$WORK/z0big" 2>&1 || fail "--zero 0 in 12 GiB: exit $?"
ar=$(awk '$1 == "D" && $2 == "all-reduce" {print $4, $5}' "$WORK/z0big")
rs=$(awk '$1 == "D" && $2 == "reduce-scatter" {print $4, $5}' "$WORK/z1")
ag=$(awk '$1 == "D" && $2 == "all-gather" {print $4, $5}' "$WORK/z1")
[ "$ar" = "707.1 MiB" ] && [ "$rs" = "353.5 MiB" ] && [ "$ag" = "353.5 MiB" ] ||
    fail "--zero 1: D all-reduce '$ar' with zero 0, reduce-scatter '$rs' and all-gather '$ag'"
"$FF" plan --model gpt2-124m --batch 4 --seq 64 --ranks 4 --memory 1.5GiB --checkpoint off \
    --zero 1 > "$WORK/zt" 2>&1 || fail "--zero 1 ranks: exit $?"
grep -qE "^ +[0-9]+ 1x1x1x4 " "$WORK/zt" || fail "--zero 1: 1x1x1x4 not ranked as fitting"
bad 2 "--zero 3: expected 0, 1 or 2"              --model gpt2 --zero 3
bad 2 "ZeRO (zero 1) with masked training (a pruned model without SAMO) is not supported yet" \
    --model gpt2 --ranks 4 --sparsity 0.5 --zero 1
bad 2 "--zero-gather sometimes: expected overlap or blocking" --model gpt2 --zero 1 --zero-gather sometimes
"$FF" plan --model gpt2 --ranks 4 --sparsity 0.5 --samo --zero 1 > "$WORK/zs" 2>&1 ||
    fail "--samo --zero 1: exit $?: $(tail -1 "$WORK/zs")"
# ZeRO's gathers beside the next forward (docs/planner.md, "ZeRO's gathers"):
# the same bytes as timed blocking after AdamW, less of them exposed, a
# shorter step (GPT-2 124M, 1x1x1x8, Perlmutter's profile)
ZG="--model gpt2 --ranks 8 --ranks-per-node 4 --batch 32 --seq 1024 --machine perlmutter --grid 1x1x1x8 --zero 1"
"$FF" plan $ZG > "$WORK/zgo" 2>&1 || fail "--zero-gather overlap: exit $?"
"$FF" plan $ZG --zero-gather blocking > "$WORK/zgb" 2>&1 || fail "--zero-gather blocking: exit $?"
python3 - "$WORK/zgo" "$WORK/zgb" <<'PY' || fail "ZeRO's gathers: overlap against blocking"
import re, sys
def read(p):
    t = open(p).read()
    step = float(re.search(r"^  step ([0-9.]+) ms", t, re.M).group(1))
    ag = re.search(r"^  D +all-gather +(\d+) +([0-9.]+ \w+)", t, re.M).groups()
    exp = re.search(r"D allgather exposed +([0-9.]+) (us|ms)", t)
    e = float(exp.group(1)) * (1e-3 if exp.group(2) == "us" else 1)
    return step, ag, e
o, b = read(sys.argv[1]), read(sys.argv[2])
ok = o[1] == b[1] and o[0] < b[0] and o[2] < b[2]
print(f"ZeRO's gathers: step {o[0]} ms beside the forward, {b[0]} ms blocking; D all-gather "
      f"{o[1]} and {b[1]}, exposed {o[2]} and {b[2]} ms: {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
PY
"$FF" plan --model gpt2-124m --batch 8 --seq 64 --stages 2 --grid 1x1x1x2 --zero 1 > "$WORK/zp" 2>&1 ||
    fail "--zero 1 with 2 stages: exit $?: $(tail -1 "$WORK/zp")"
grep -qE "^  D +reduce-scatter " "$WORK/zp" && grep -qE "^  D +all-gather " "$WORK/zp" ||
    fail "--zero 1 with 2 stages: no D reduce-scatter and all-gather rows"

# the U-Net (docs/planner.md, "The U-Net"): ranked on every grid of 8, one
# grid's detail with GroupNorm's all-reduces and the skips' all-gathers over Y,
# the GPT's shape options and the cost models it does not have refused
"$FF" plan --model unet-tiny --ranks 8 > "$WORK/unet" 2>&1 || fail "unet-tiny: exit $?: $(tail -1 "$WORK/unet")"
grep -q "^model unet-tiny: a U-Net of 8x8 images" "$WORK/unet" || fail "unet-tiny: no header"
grep -q "20 grids of 8 ranks, 20 fit" "$WORK/unet" || fail "unet-tiny: not 20 grids fitting"
"$FF" plan --model unet-tiny --ranks 8 --grid 1x4x1x2 > "$WORK/unetg" 2>&1 ||
    fail "unet-tiny --grid: exit $?"
grep -qE "^  Y +all-gather +5 " "$WORK/unetg" || fail "unet-tiny --grid: not 5 all-gathers over Y"
grep -q "parameters 40.5 KiB" "$WORK/unetg" || fail "unet-tiny --grid: $(grep 'memory per' "$WORK/unetg")"
"$FF" plan --model unet-tiny --ranks 8 --json > "$WORK/unet.json" 2>&1 || fail "unet-tiny --json: exit $?"
grep -q '"kind": "unet", "image_size": 8, "base_channels": 8' "$WORK/unet.json" ||
    fail "unet-tiny --json: no U-Net model keys"
# a Table II preset (docs/unet.md, "The paper's presets"): its shape and
# parameters (6,685 C0^2 at C0 512)
"$FF" plan --model unet-1b --ranks 8 --batch 8 > "$WORK/unet1b" 2>&1 || fail "unet-1b: exit $?: $(tail -1 "$WORK/unet1b")"
grep -q "^model unet-1b: a U-Net of 64x64 images, 512 channels x 1,2,3,4, 3 blocks per level, GroupNorm of 16 channels, attention in the middle and at 16x16, 8x8; 1.752e+09 parameters" "$WORK/unet1b" ||
    fail "unet-1b: $(grep '^model' "$WORK/unet1b")"
bad 2 "describe a GPT, not the U-Net unet-tiny"   --model unet-tiny --layers 3
bad 2 "the planner's U-Net with a cost model other than full" --model unet-tiny --cost paper
bad 2 "unknown model 'unet-huge'"                 --model unet-huge

# under a launcher, without MPI_Init, only rank 0 prints
if "$MPIEXEC" -np 2 --oversubscribe "$FF" plan --model tiny --ranks 4 --batch 4 --seq 32 \
    > "$WORK/mpi" 2>&1; then
    n=$(grep -c '^model tiny' "$WORK/mpi")
    [ "$n" = 1 ] || fail "under mpirun -np 2: the header printed $n times"
else
    fail "under mpirun -np 2: exit $?: $(cat "$WORK/mpi")"
fi

echo "plan_cli: $failures failures"
[ "$failures" = 0 ]
