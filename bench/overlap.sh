#!/bin/sh
# The overlap benchmark of docs/overlap.md: one namespace (2 and 4 ranks) and
# an emulated cluster (2 nodes x 1 and x 2 ranks, 1 Gbit/s) made by
# bench/cluster.sh (docs/design.md §8).
# Prints each configuration's table (medians of REPS repetitions) and, at
# the end, the hidden fraction and total ms of every mechanism; the
# raw JSON lines go OUTSIDE the source tree, to $OUT (default
# ${FF_BENCH_OUT:-/tmp/fourfold-bench}/overlap.jsonl; the headline's to
# OUT-headline.jsonl, with the median over its 5 runs printed). Needs root
# (the emulated cluster). ~20 minutes.
#   usage: bench/overlap.sh [build-dir]            the full sweep
#          bench/overlap.sh [build-dir] headline   the 80% goal of issue 2, in
#              5 independent runs: 16 MiB all-reduce, 2 nodes x 2 ranks, 1 Gbit/s,
#              300 ms of sgemm, for wait, poll-200us and thread-200us
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${1:-build}
MODE=${2:-sweep}
BIN=$PWD/$BUILD/bench/ff_bench_overlap
CLUSTER=$PWD/bench/cluster.sh
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/overlap.jsonl}
REPS=${REPS:-7}
mkdir -p "$(dirname "$OUT")"
. scripts/env.sh
export OMPI_MCA_mpi_yield_when_idle=1

run() { # label, then mpirun-or-cluster command...
    label=$1
    shift
    echo
    "$@" --reps "$REPS" --label "$label" 2>&1 | grep -v '^cluster:' | tee -a "$OUT.tmp" | grep -v '^{'
}
: > "$OUT.tmp"
[ -x "$BIN" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
"$CLUSTER" --check || exit 2
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores"

if [ "$MODE" = headline ]; then
    for i in 1 2 3 4 5; do
        run "headline run $i" "$CLUSTER" -n 2 -m 2 -r 1gbit -b 256kb "$BIN" \
            --size 16MiB --compute-ms 300 --mech wait,poll-200us,thread-200us
    done
    grep '^{' "$OUT.tmp" > "${OUT%.jsonl}-headline.jsonl"
    rm -f "$OUT.tmp"
    python3 - "${OUT%.jsonl}-headline.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\nhidden fraction over the 5 runs (median [min-max]), and total ms:")
for m in ("wait", "poll-200us", "thread-200us"):
    h = sorted(r["hidden"] for r in rows if r["mechanism"] == m)
    t = sorted(r["total_ms"] for r in rows if r["mechanism"] == m)
    print(f"  {m:14s} hidden {statistics.median(h):.2f} [{h[0]:.2f}-{h[-1]:.2f}]"
          f"  total {statistics.median(t):.0f} ms [{t[0]:.0f}-{t[-1]:.0f}]")
PY
    echo "JSON lines written to ${OUT%.jsonl}-headline.jsonl"
    exit 0
fi

# one namespace: shared memory, every core computing; comm is CPU work
for idle in "" --idle; do
    run "local np2 $idle" mpirun -np 2 "$BIN" --size 64MiB --compute-ms 60 $idle
    run "local np4 $idle" mpirun -np 4 "$BIN" --size 64MiB --compute-ms 150 $idle
done

# the emulated cluster: 1 Gbit/s between nodes
for idle in "" --idle; do
    run "testbed 2x1 1gbit burst256k $idle" "$CLUSTER" -n 2 -m 1 -r 1gbit -b 256kb "$BIN" \
        --size 16MiB --compute-ms 300 $idle
    run "testbed 2x2 1gbit burst256k $idle" "$CLUSTER" -n 2 -m 2 -r 1gbit -b 256kb "$BIN" \
        --size 16MiB --compute-ms 300 $idle
done
# bench/cluster.sh's default tbf burst (32 KB) splits every TSO packet into
# MTU frames, which costs the shared cores dearly
run "testbed 2x2 1gbit burst32k" "$CLUSTER" -n 2 -m 2 -r 1gbit "$BIN" \
    --size 16MiB --compute-ms 300 --mech wait,poll-200us,thread-200us
# how fine the compute must be chunked for polling to keep the wire busy
for gemm in 64 256 512; do
    run "testbed 2x2 1gbit burst256k gemm$gemm" "$CLUSTER" -n 2 -m 2 -r 1gbit -b 256kb "$BIN" \
        --size 16MiB --compute-ms 300 --gemm $gemm --mech wait,poll-200us,thread-200us
done
# the other collectives
for coll in allgather reduce_scatter alltoall; do
    run "testbed 2x2 1gbit burst256k $coll" "$CLUSTER" -n 2 -m 2 -r 1gbit -b 256kb "$BIN" \
        --coll $coll --size 16MiB --compute-ms 300 --mech wait,poll-200us,thread-200us,mpi-poll-200us
done
grep '^{' "$OUT.tmp" > "$OUT"
rm -f "$OUT.tmp"
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\nhidden fraction (total ms) per configuration and mechanism:")
for label in dict.fromkeys(r["label"] for r in rows):
    cells = [f"{r['mechanism']} {r['hidden']:.2f} ({r['total_ms']:.0f})"
             for r in rows if r["label"] == label]
    print(f"  {label.strip():40s} " + ", ".join(cells))
PY
echo
echo "JSON lines written to $OUT"
