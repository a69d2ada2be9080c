#!/bin/sh
# The decomposition benchmark of docs/linear.md, "Decomposition" (issue 25):
# one GPT training step (bench/gpt.c) on an emulated cluster of 2 nodes x 2
# ranks at 1 Gbit/s, without and with a 100 us one-way delay, made by
# bench/cluster.sh (docs/design.md §8).
# Three cases: the model L=2, C=256, NH=4, V=512, B=8, T=128 on 2x2x1x1 (X
# inside a node, Y across the nodes) and on 1x4x1x1 (Y over all four ranks),
# and a small one (C=64, NH=4) on 2x2x1x1 where the GEMMs are short. Each
# runs decomposition off, on with K = 2, 3, 4, and the planner's per-layer
# plan for that case and link (`fourfold plan --per-layer`, the matching
# profiles/tb-2x2-1gbit-d*.json), alternating, ROUNDS times, each run the
# median of REPS steps after 2 warm-ups. GEMM panels of PANEL rows (default
# 256) in the runs and the planner: a rank's 1024 rows are four panels, so
# every K is used as given (the default panels, ~400 MFLOP, would be one
# panel for these small layers, leaving nothing to decompose). Prints the
# median step time over rounds per variant and its ratio to off; the
# raw JSON lines go OUTSIDE the source tree, to $OUT (default
# ${FF_BENCH_OUT:-/tmp/fourfold-bench}/decompose.jsonl). CASES
# (name:grid:C ...), DELAYS (us), VARIANTS (0 = off, K, plan; nooag = OAG
# off, cmm = OAG off with the collective matmul; rscmm = the reduce-scatter
# collective matmul; noors, rscmm-noors: the same two with ORS off) and PROGRESS
# (poll, the default, or thread: a progress thread) select a subset. Needs
# root (the emulated cluster).
# About 10 minutes with the defaults.
#   usage: bench/decompose.sh [build-dir]
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$PWD/$BUILD/bench/ff_bench_gpt
CLI=$PWD/$BUILD/fourfold
CLUSTER=$PWD/bench/cluster.sh
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/decompose.jsonl}
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-3}
PANEL=${PANEL:-256}
CASES=${CASES:-base:2x2x1x1:256 base:1x4x1x1:256 small:2x2x1x1:64}
DELAYS=${DELAYS:-0 100}
VARIANTS=${VARIANTS:-0 2 3 4 plan}
PROGRESS=${PROGRESS:-poll}
[ -x "$BIN" ] && [ -x "$CLI" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
"$CLUSTER" -d 100 --check || exit 2
. scripts/env.sh
mkdir -p "$(dirname "$OUT")"
PLANS=$(dirname "$OUT")/decompose-plans
mkdir -p "$PLANS"
: > "$OUT.tmp"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

for delay in $DELAYS; do
    for case in $CASES; do
        name=${case%%:*} rest=${case#*:}
        grid=${rest%%:*} C=${rest#*:}
        plan=$PLANS/plan-$name-$grid-d$delay.json
        "$CLI" plan --layers 2 --hidden "$C" --heads 4 --vocab 512 --positions 128 --batch 8 \
            --seq 128 --grid "$grid" --machine "profiles/tb-2x2-1gbit-d${delay}us.json" \
            --panel-rows "$PANEL" --progress "$PROGRESS" --per-layer --out "$plan" | grep -A 20 '^per-layer' | sed 's/^/# /'
        for r in $(seq "$ROUNDS"); do
            for v in $VARIANTS; do
                case $v in
                plan) args="--plan $plan" ;;
                nooag) args="--oag 0" ;;                # every weight gather exposed
                cmm) args="--oag 0 --cmm 1" ;;          # ... each run as a collective matmul
                rscmm) args="--rs-cmm 1" ;;             # dW fed to its reduce-scatter
                noors) args="--ors 0" ;;                # every dW reduce-scatter waited at once
                rscmm-noors) args="--ors 0 --rs-cmm 1" ;;
                *) args="--decompose $v" ;;
                esac
                "$CLUSTER" -n 2 -m 2 -r 1gbit -d "$delay" "$BIN" --grid "$grid" --L 2 --C "$C" \
                    --NH 4 --V 512 --maxT 128 --B 8 --T 128 --panel "$PANEL" --progress "$PROGRESS" --reps "$REPS" \
                    $args --label "d$delay $name $grid $v round $r" 2>&1 | grep '^{' |
                    sed "s/^{/{\"delay_us\":$delay,\"case\":\"$name\",\"variant\":\"$v\",/" \
                        >> "$OUT.tmp"
            done
        done
    done
done
cat "$OUT.tmp" >> "$OUT"
python3 - "$OUT.tmp" $VARIANTS <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
variants = sys.argv[2:]
base = "0" if "0" in variants else variants[0]
keys = sorted({(r["delay_us"], r["case"], r["grid"]) for r in rows})
print(f"\nstep time, median over rounds of each run's median (ms); ratio to variant {base}")
print(f"{'delay':>6} {'case':>6} {'grid':>8} " + " ".join(f"{v:>14}" for v in variants))
for d, c, g in keys:
    med = {}
    for v in variants:
        t = [r["median_ms"] for r in rows
             if (r["delay_us"], r["case"], r["grid"], r["variant"]) == (d, c, g, v)]
        med[v] = statistics.median(t) if t else float("nan")
    cells = [f"{med[v]:8.1f} {med[v] / med[base]:5.2f}" for v in variants]
    print(f"{d:>4}us {c:>6} {g:>8} " + " ".join(cells))
PY
rm -f "$OUT.tmp"
echo "JSON lines appended to $OUT"
