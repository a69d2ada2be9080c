#!/bin/sh
# rec-whole (whole-vector recursive doubling all-reduce) against the MPI
# library's and fourfold's others, with AUTO allowed to pick it
# (FF_STRICT_VOLUME=0) under the shipped profiles (profiles/tb-*.json), on the
# emulated 2x2 and 4x1 clusters, 1 Gbit/s, 0 and 100 us, 3 runs each.
#   usage (from the repository root, as root): bench/results/coll/whole-ar/run.sh
set -u
TB=../shared/tools/testbed/tbcluster.sh
OUT=bench/results/coll/whole-ar
for k in 1 2 3; do
for shape in "2 2" "4 1"; do
set -- $shape
for d in 0 100; do name=tb-$1x$2-1gbit-d${d}us
  echo "$name r$k $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
  rm -f $OUT/$name.r$k.jsonl
  TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_STRICT_VOLUME=0 -x FF_PROFILE=$PWD/profiles/$name.json" \
    $TB -p ffcoll -s 10.79.0 -n $1 -m $2 -r 1gbit -d $d all -- build/fourfold bench coll --colls ar \
    --algos mpi-blk,mpi,ring,rec,rec-whole,hier-ring,hier-rec,auto \
    -b 4K -e 4M -f 4 -n 15 -w 1 --max-seconds 8 --place out --json $OUT/$name.r$k.jsonl > $OUT/$name.r$k.coll.txt 2>&1
done; done; done
echo "EXIT $(date -u +%T)" >> $OUT/runs.log
