#!/bin/sh
# The pipeline benchmark of docs/pipeline.md (issue 26): AxoNN's
# message-driven schedule against 1F1B, with and without a straggler, and
# the measured bubble against (P-1)/(M+P-1), on the emulated cluster of
# bench/cluster.sh (docs/design.md §8), with a 100 us one-way delay between
# nodes (this machine's kernel has no netem, so the delay is
# bench/delayline.c's user-space line, whose late wake-ups add jitter).
#
# Two cases (bench/gpt.c, one training step of M micro-batches):
#  emulated  4 stages of one rank on 2 nodes x 2 ranks at 1 Gbit/s (the
#            boundary between stages 1 and 2 crosses the nodes); a model
#            so small (L=8, C=64) that compute is negligible, and every
#            pass sleeps PASS ms (--pass-ms): compute emulated by sleeping,
#            since 4 computing ranks would share this machine's 2 cores
#            and fill each other's bubbles. The straggler: stage 1 sleeps
#            SLOW ms more per pass, fixed ("yes") or uniform in [0, 2 SLOW]
#            per pass ("jitter", --slow-jitter 1: a noisy neighbour).
#  compute   2 stages of one rank on 2 nodes x 1 rank (one core each) at
#            1 Gbit/s, real compute (L=8, C=256, NH=4, V=512, T=128, 4
#            sequences per micro-batch); the straggler: stage 0 sleeps
#            SLOW2 ms more per pass.
# Each configuration runs both schedules alternately, ROUNDS times, each
# run the median of REPS steps after 2 warm-ups. Prints the median step
# time over rounds, message / 1F1B, and each stage's bubble, 1 - (time in
# its passes, ff_gpt_pipeline_times) / step, against (P-1)/(M+P-1) (in the
# compute case the step also holds the optimizer and gradient reductions,
# which count as bubble here). Raw JSON
# lines go OUTSIDE the source tree, to $OUT (default
# ${FF_BENCH_OUT:-/tmp/fourfold-bench}/pipeline.jsonl). MS (micro-batch
# counts of the emulated case), PASS, SLOW, SLOW2 and CASES select. Needs
# root (the emulated cluster). About 10 minutes with the defaults.
#   usage: bench/pipeline.sh [build-dir]
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$PWD/$BUILD/bench/ff_bench_gpt
CLUSTER=$PWD/bench/cluster.sh
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/pipeline.jsonl}
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-3}
MS=${MS:-4 8 16}
PASS=${PASS:-20}
SLOW=${SLOW:-10}
SLOW2=${SLOW2:-20}
CASES=${CASES:-emulated compute}
[ -x "$BIN" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
"$CLUSTER" -d 100 --check || exit 2
. scripts/env.sh
mkdir -p "$(dirname "$OUT")"
: > "$OUT.tmp"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

run() { # case M straggler schedule round ARGS...
    c=$1 m=$2 slow=$3 sch=$4 r=$5
    shift 5
    "$CLUSTER" "$@" -r 1gbit -d 100 "$BIN" --micro "$m" --schedule "$sch" --reps "$REPS" \
        $BENCH_ARGS --label "$c M=$m slow=$slow $sch round $r" 2>&1 | grep '^{' |
        sed "s/^{/{\"case\":\"$c\",\"straggler\":$slow,/" >> "$OUT.tmp"
}

for c in $CASES; do
    if [ "$c" = emulated ]; then
        Ms=$MS
    else
        Ms=8
    fi
    for m in $Ms; do
        slows="0 1"
        [ "$c" = emulated ] && slows="0 1 2"
        for slow in $slows; do
            for r in $(seq "$ROUNDS"); do
                for sch in message 1f1b; do
                    if [ "$c" = emulated ]; then
                        BENCH_ARGS="--grid serial --stages 4 --L 8 --C 64 --NH 4 --V 128 --maxT 32"
                        BENCH_ARGS="$BENCH_ARGS --B 2 --T 32 --pass-ms $PASS"
                        [ "$slow" != 0 ] && BENCH_ARGS="$BENCH_ARGS --slow-stage 1 --slow-ms $SLOW"
                        [ "$slow" = 2 ] && BENCH_ARGS="$BENCH_ARGS --slow-jitter 1"
                        run "$c" "$m" "$slow" "$sch" "$r" -n 2 -m 2
                    else
                        BENCH_ARGS="--grid serial --stages 2 --L 8 --C 256 --NH 4 --V 512"
                        BENCH_ARGS="$BENCH_ARGS --maxT 128 --B 4 --T 128"
                        [ "$slow" = 1 ] && BENCH_ARGS="$BENCH_ARGS --slow-stage 0 --slow-ms $SLOW2"
                        run "$c" "$m" "$slow" "$sch" "$r" -n 2 -m 1
                    fi
                done
            done
        done
    done
done
cat "$OUT.tmp" >> "$OUT"
python3 - "$OUT.tmp" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["case"], r["micro"], r["straggler"]) for r in rows})
print("\nstep time: median over rounds of each run's median (ms); each stage's measured")
print("bubble 1 - busy/step, median over rounds, against (P-1)/(M+P-1)")
print(f"{'case':>9} {'M':>3} {'straggler':>9} {'message':>9} {'1f1b':>9} {'msg/1f1b':>9}"
      f" {'(P-1)/(M+P-1)':>13}  bubble: message / 1f1b")
for c, m, s in keys:
    med, idle = {}, {}
    for sch in ("message", "1f1b"):
        sel = [r for r in rows
               if (r["case"], r["micro"], r["straggler"], r["schedule"]) == (c, m, s, sch)]
        med[sch] = statistics.median(r["median_ms"] for r in sel)
        P = sel[0]["stages"]
        idle[sch] = [statistics.median(1 - r["stage_busy_ms"][k] / r["median_ms"] for r in sel)
                     for k in range(P)]
    bubble = (P - 1) / (m + P - 1)
    fmt = lambda v: " ".join(f"{x:.2f}" for x in v)
    print(f"{c:>9} {m:>3} {('no', 'yes', 'jitter')[s]:>9} {med['message']:9.1f} {med['1f1b']:9.1f}"
          f" {med['message'] / med['1f1b']:9.3f} {bubble:13.3f}  {fmt(idle['message'])} / "
          f"{fmt(idle['1f1b'])}")
PY
rm -f "$OUT.tmp"
