#!/bin/sh
# Issue 52's ZeRO measurement (docs/design.md, "ZeRO over D"): GPT-2 124M
# (L=12, C=768, NH=12, V=50257) training steps of B sequences of T tokens
# with --zero 0, 1 and 2, alternating within each of ROUNDS rounds, on
# each grid of GRIDS (default 1x1x1x4 and 2x1x1x4: 4 and 8 ranks, D = 4),
# one thread a rank (more ranks than cores run oversubscribed: their step
# times are then the machine's, not a cluster's). Each run is
# bench/gpt.c's median of REPS steps after 2 warm-ups. Prints per grid and
# --zero the median step time over rounds, its ratio to --zero 0, the
# largest resident set of any rank (/usr/bin/time's %M over mpirun: its
# largest child) and its saving against --zero 0, and the model state
# ff_gpt_memory counts on rank 0.
# PRECISION (fp32, the default, or bf16-mixed), B (default 8), T (default
# 64), REPS (3), ROUNDS (2). The JSON lines go OUTSIDE the source tree, to
# $OUT (default ${FF_BENCH_OUT:-/tmp/fourfold-bench}/zero.jsonl).
# About 10 minutes with the defaults on 2 cores.
#   usage: bench/zero.sh [build-dir]
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$PWD/$BUILD/bench/ff_bench_gpt
[ -x "$BIN" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/zero.jsonl}
GRIDS=${GRIDS:-1x1x1x4 2x1x1x4}
PRECISION=${PRECISION:-fp32}
B=${B:-8}
T=${T:-64}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-2}
. scripts/env.sh
mkdir -p "$(dirname "$OUT")"
: > "$OUT.tmp"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
for r in $(seq "$ROUNDS"); do
    for g in $GRIDS; do
        n=$(echo "$g" | tr x '\n' | awk 'BEGIN { p = 1 } { p *= $1 } END { print p }')
        for z in 0 1 2; do
            log=$(mktemp)
            /usr/bin/time -f 'maxrss_kib=%M' mpirun --oversubscribe --mca mpi_yield_when_idle 1 \
                --bind-to none -np "$n" "$BIN" --grid "$g" --threads 1 --L 12 --C 768 --NH 12 \
                --V 50257 --maxT 1024 --B "$B" --T "$T" --reps "$REPS" --warmup 2 \
                --precision "$PRECISION" --zero "$z" --rss --label "zero $z" >"$log" 2>&1 ||
                { cat "$log" >&2; rm -f "$log"; exit 1; }
            python3 - "$log" "$z" "$r" >>"$OUT.tmp" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
js = json.loads([l for l in text.splitlines() if l.startswith('{"bench":"gpt"')][-1])
js["zero"], js["round"] = int(sys.argv[2]), int(sys.argv[3])
js["maxrss_kib"] = int(re.search(r"maxrss_kib=(\d+)", text).group(1))
m = re.search(r"model state ([0-9.]+);", text)
js["state_mib"] = float(m.group(1)) if m else None
print(json.dumps(js))
PY
            rm -f "$log"
        done
    done
done
cat "$OUT.tmp" >>"$OUT"
python3 - "$OUT.tmp" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'grid':9} {'zero':>4} {'step ms (rounds)':>22} {'median':>8} {'vs 0':>6} "
      f"{'max RSS MiB':>11} {'saved MiB':>9} {'state MiB':>9}")
for g in dict.fromkeys(r["grid"] for r in rows):
    base = None
    for z in (0, 1, 2):
        rs = [r for r in rows if r["grid"] == g and r["zero"] == z]
        ms = statistics.median(r["median_ms"] for r in rs)
        rss = max(r["maxrss_kib"] for r in rs) / 1024
        if base is None:
            base = (ms, rss)
        st = rs[0]["state_mib"]
        runs = ", ".join(f"{r['median_ms']:.0f}" for r in rs)
        print(f"{g:9} {z:4} {runs:>22} "
              f"{ms:8.0f} {ms / base[0]:6.3f} {rss:11.0f} {base[1] - rss:9.0f} "
              f"{'-' if st is None else f'{st:.1f}':>9}")
PY
rm -f "$OUT.tmp"
echo "JSON lines appended to $OUT"
