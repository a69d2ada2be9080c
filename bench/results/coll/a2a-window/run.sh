#!/bin/sh
# all-to-all: pairwise one partner at a time (FF_A2A_WINDOW=1) against all at once (8), same configurations
set -u
cd /work/main
TB=../shared/tools/testbed/tbcluster.sh
OUT=bench/results/coll/a2a-window
for shape in 4x1 2x2; do n=${shape%x*} m=${shape#*x}
for d in 0 100; do name=tb-$shape-1gbit-d${d}us
for k in 1 2 3; do for w in 1 8; do
  echo "$name r$k w$w $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
  rm -f $OUT/$name.w$w.r$k.jsonl
  TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_A2A_WINDOW=$w" $TB -p ffcoll -s 10.79.0 -n $n -m $m -r 1gbit -d $d all -- \
    build/fourfold bench coll --colls a2a --algos mpi-blk,mpi,ring -b 4K -e 64M -f 4 -n 15 -w 1 --max-seconds 8 --place out \
    --json $OUT/$name.w$w.r$k.jsonl > $OUT/$name.w$w.r$k.coll.txt 2>&1
done; done; done; done
echo EXIT >> $OUT/runs.log
