#!/bin/sh
# Does timing the MPI library's algorithms in the same interleaved
# iterations change the others' times? All-reduce of 4-64 KiB on the
# emulated 2x2 cluster with the 100 us delay, with the shipped profile, 3
# rounds of: our algorithms and AUTO alone, then the same with mpi-blk and
# mpi added (the set bench/coll_tuned_sweep.sh times).
#   usage (from the repository root, as root): bench/results/coll/direct/interleave/run.sh [build dir]
#   table: python3 bench/coll_table.py bench/results/coll/direct/interleave/{ours,with-mpi}.r*.jsonl
set -u
FF=${1:-build}/fourfold
OUT=bench/results/coll/direct/interleave
TB=../shared/tools/testbed/tbcluster.sh
name=tb-2x2-1gbit-d100us
for k in 1 2 3; do
for set in ours with-mpi; do
  algos=ring,rec,rec-whole,direct,hier-ring,hier-rec,auto
  [ $set = with-mpi ] && algos=mpi-blk,mpi,$algos
  echo "$set r$k $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
  rm -f $OUT/$set.r$k.jsonl
  TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_PROFILE=$PWD/profiles/$name.json" \
    $TB -p ffcoll -s 10.79.0 -n 2 -m 2 -r 1gbit -d 100 all -- $FF bench coll --colls ar \
    --algos $algos -b 4K -e 64K -f 4 -n 15 -w 1 --place out --json $OUT/$set.r$k.jsonl \
    > $OUT/$set.r$k.coll.txt 2>&1
  echo "   rc $? $(date -u +%T)" >> $OUT/runs.log
done; done
