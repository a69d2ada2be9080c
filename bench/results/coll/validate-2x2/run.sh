#!/bin/sh
# AUTO with the shipped profiles (profiles/tb-2x2-*.json, fitted with the
# alpha constraint) on the emulated 2x2 cluster, against fourfold's flat and
# hierarchical algorithms and the library's, 3 runs per delay.
#   usage (from the repository root, as root): bench/results/coll/validate-2x2/run.sh
set -u
TB=../shared/tools/testbed/tbcluster.sh
OUT=bench/results/coll/validate-2x2
for d in 0 100; do name=tb-2x2-1gbit-d${d}us
for k in 1 2 3; do
  echo "$name r$k $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
  rm -f $OUT/$name.r$k.jsonl
  TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_PROFILE=$PWD/profiles/$name.json" $TB -p ffcoll -s 10.79.0 \
    -n 2 -m 2 -r 1gbit -d $d all -- build/fourfold bench coll --colls ag,rs,ar --algos mpi-blk,mpi,ring,rec,hier-ring,hier-rec,auto \
    -b 4K -e 64M -f 4 -n 15 -w 1 --max-seconds 8 --place out --json $OUT/$name.r$k.jsonl > $OUT/$name.r$k.coll.txt 2>&1
done; done
echo "EXIT $(date -u +%T)" >> $OUT/runs.log
