#!/bin/sh
# Measured picks on the emulated 2x2 and 4x1 clusters (1 Gbit/s, 0 and
# 100 us one-way delay): `bench tune` rewrites the picks of a copy of each
# shipped profile (profiles/tb-*.json) in OUT, then every collective and
# algorithm, AUTO included and timed in the same interleaved iterations,
# runs with FF_PROFILE= the tuned copy, 4 KiB to 4 MiB per rank (the sizes
# tuned), RUNS runs each (default 3; the run the outer loop). The same as
# bench/results/coll/tuned/run.sh (the sweep of 2026-11-23), with the
# direct algorithm among the candidates and the columns.
#   usage (from the repository root, as root): bench/coll_tuned_sweep.sh [build dir] [OUT]
#   TUNE_ARGS="--repeats 1" (say) is passed to bench tune (default: its defaults);
#   JOBS=N tune jobs per cluster (default 1), the job the outer loop, each
#     with --history OUT/NAME.history.jsonl: the last decides on all N;
#   ALGOS= the --algos of bench coll (default: every algorithm, AUTO included)
#   table: python3 bench/coll_table.py OUT/tb-*.r*.jsonl
set -u
FF=${1:-build}/fourfold
OUT=${2:-bench/results/coll/direct}
TUNE_ARGS=${TUNE_ARGS:-}
JOBS=${JOBS:-1}
RUNS=${RUNS:-3}
ALGOS=${ALGOS:-mpi-blk,mpi,ring,rec,rec-whole,direct,hier-ring,hier-rec,auto}
TB=../shared/tools/testbed/tbcluster.sh
mkdir -p "$OUT"
for j in $(seq $JOBS); do
for shape in "2 2" "4 1"; do
set -- $shape
for d in 0 100; do name=tb-$1x$2-1gbit-d${d}us
  [ -f $OUT/$name.json ] || cp profiles/$name.json $OUT/$name.json
  hist= tag=
  [ "$JOBS" = 1 ] || hist="--history $PWD/$OUT/$name.history.jsonl" tag=.j$j
  echo "$name tune$tag $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
  TB_MPIRUN_ARGS="--mca btl_tcp_links 2" \
    $TB -p ffcoll -s 10.79.0 -n $1 -m $2 -r 1gbit -d $d all -- $FF bench tune \
    --profile $PWD/$OUT/$name.json -b 4K -e 4M -f 4 -n 15 $hist $TUNE_ARGS \
    > $OUT/$name.tune$tag.txt 2>&1
  echo "   rc $? $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
done; done; done
for k in $(seq $RUNS); do
for shape in "2 2" "4 1"; do
set -- $shape
for d in 0 100; do name=tb-$1x$2-1gbit-d${d}us
  echo "$name r$k $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
  rm -f $OUT/$name.r$k.jsonl
  TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_PROFILE=$PWD/$OUT/$name.json" \
    $TB -p ffcoll -s 10.79.0 -n $1 -m $2 -r 1gbit -d $d all -- $FF bench coll \
    --algos $ALGOS \
    -b 4K -e 4M -f 4 -n 15 -w 1 --max-seconds 8 --place out --json $OUT/$name.r$k.jsonl \
    > $OUT/$name.r$k.coll.txt 2>&1
  echo "   rc $? $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
done; done; done
echo "EXIT $(date -u +%T)" >> $OUT/runs.log
