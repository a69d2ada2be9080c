#!/bin/sh
# The linear-layer benchmark of docs/linear.md: an N -> T pair with
# k = n = 2048 and 4096 rows, every overlap off and on, on 1, 2, 4 and 8
# ranks of one namespace and on the emulated cluster (2 nodes x 1 and x 2
# ranks, 1 Gbit/s). Prints each run's table (medians of REPS steps) and, at
# the end, one line per run: step ms with overlaps off -> on, their ratio and
# the hidden fraction. The raw JSON lines are appended OUTSIDE the source
# tree, to $OUT (default ${FF_BENCH_OUT:-/tmp/fourfold-bench}/linear.jsonl).
# The cluster runs need root: the emulated cluster is bench/cluster.sh
# (docs/design.md §8).
# ~15 minutes.
#   usage: bench/linear.sh [build-dir] [local|cluster|all]
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${1:-build}
WHERE=${2:-all}
BIN=$PWD/$BUILD/bench/ff_bench_linear
CLUSTER=$PWD/bench/cluster.sh
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/linear.jsonl}
REPS=${REPS:-5}
ARGS=${ARGS:---k 2048 --n 2048 --rows 4096 --layers 2}
mkdir -p "$(dirname "$OUT")"
. scripts/env.sh
export OMPI_MCA_mpi_yield_when_idle=1
[ -x "$BIN" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
[ "$WHERE" = local ] || "$CLUSTER" --check || exit 2
: > "$OUT.tmp"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

run() { # label, then the launcher and its arguments
    label=$1
    shift
    echo
    "$@" $ARGS --reps "$REPS" --label "$label" 2>&1 | grep -v '^cluster:' |
        tee -a "$OUT.tmp" | grep -v '^{' | grep -v -e '^gemm ' -e '^GEMM' -e '^fwd' -e '^dI' -e '^dW' || true
}

if [ "$WHERE" != cluster ]; then
    for g in 1x1x1x1; do run "local 1 rank" mpirun -np 1 "$BIN" --grid $g; done
    for g in 2x1x1x1 1x2x1x1 1x1x2x1 1x1x1x2; do run "local 2 ranks" mpirun -np 2 "$BIN" --grid $g; done
    for g in 2x2x1x1 4x1x1x1 2x1x2x1 1x1x2x2; do run "local 4 ranks" mpirun -np 4 "$BIN" --grid $g; done
    for g in 2x2x2x1 8x1x1x1 2x2x1x2 1x1x8x1; do run "local 8 ranks" mpirun -np 8 "$BIN" --grid $g; done
fi
if [ "$WHERE" != local ]; then
    for g in 2x1x1x1 1x1x2x1 1x1x1x2; do
        run "cluster 2x1 1gbit" "$CLUSTER" -n 2 -m 1 -r 1gbit -b 256kb "$BIN" --grid $g
    done
    for g in 2x2x1x1 4x1x1x1 2x1x2x1 1x1x2x2; do
        run "cluster 2x2 1gbit" "$CLUSTER" -n 2 -m 2 -r 1gbit -b 256kb "$BIN" --grid $g
    done
fi
grep '^{' "$OUT.tmp" >> "$OUT" || true
echo
python3 - "$OUT.tmp" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'where':22} {'grid':9} {'step ms off -> on':>20} {'on/off':>7} {'hidden':>7}")
for r in rows:
    off, on = r["off"]["step_ms"], r["on"]["step_ms"]
    print(f"{r['label']:22} {r['grid']:9} {off:9.0f} -> {on:7.0f} {on / off:7.2f} {r['hidden']:7.2f}")
PY
rm -f "$OUT.tmp"
echo "JSON lines appended to $OUT"
