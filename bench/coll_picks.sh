#!/bin/sh
# What the selector (FF_ALGO_AUTO) picks under a given machine profile, for
# the configurations of bench/coll_testbed.sh, without the testbed: the pick
# depends only on the profile, the group's layout and the call, so a local
# run with FF_RANKS_PER_NODE reproduces it. Writes PICKS_DIR/NAME.picks.jsonl
# for every PROFILE_DIR/tb-NxM-*.json; bench/coll_table.py, given that file
# next to NAME's measured runs, prices those picks at the measured times
# (docs/coll-bench.md: profiles re-fitted after the sweep).
#
#   usage: bench/coll_picks.sh BUILD_DIR PROFILE_DIR PICKS_DIR [MAXBYTES]
#   e.g.   bench/coll_picks.sh build profiles bench/results/coll
set -eu
FF=$(cd "$1" && pwd)/fourfold
PROF=$2
OUT=$3
MAXB=${4:-64M}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for p in "$PROF"/tb-*x*-*.json; do
    name=$(basename "$p" .json)
    shape=${name#tb-}
    shape=${shape%%-*}
    n=${shape%x*} m=${shape#*x}
    rm -f "$OUT/$name.picks.jsonl"
    # -n 1 -w 0: only the choice matters here, not the (local) time
    mpirun -np $((n * m)) --oversubscribe --mca mpi_yield_when_idle 1 \
        -x FF_RANKS_PER_NODE="$m" -x FF_PROFILE="$(cd "$(dirname "$p")" && pwd)/$name.json" \
        "$FF" bench coll --algos auto -b 4K -e "$MAXB" -f 4 -n 1 -w 0 --place out \
        --json "$OUT/$name.picks.jsonl" > /dev/null
    echo "$OUT/$name.picks.jsonl"
done
