#!/bin/sh
# Does the set of algorithms timed alongside change how rec and direct rank?
# 4x1 with the 100 us delay, all-gather and reduce-scatter of 4-64 KiB, 3
# rounds of: (a) tune's candidates ring,rec,direct; (b) those and the MPI
# library's two; (c) five of fourfold's; (d) every algorithm, AUTO included.
#   usage (from the repository root, as root): bench/results/coll/worstcase/context/sets/run.sh
set -u
FF=build/fourfold
OUT=bench/results/coll/worstcase/context/sets
TB=../shared/tools/testbed/tbcluster.sh
name=tb-4x1-1gbit-d100us
run() { TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_PROFILE=$PWD/profiles/$name.json" \
    $TB -p ffcoll -s 10.79.0 -n 4 -m 1 -r 1gbit -d 100 all -- "$@"; }
for k in 1 2 3; do
for set in a b c d; do
  case $set in
  a) algos=ring,rec,direct ;;
  b) algos=mpi-blk,mpi,ring,rec,direct ;;
  c) algos=ring,rec,direct,hier-ring,hier-rec,ring,rec,direct,hier-ring ;; # as run: each timed once, 5
  d) algos=mpi-blk,mpi,ring,rec,rec-whole,direct,hier-ring,hier-rec,auto ;;
  esac
  rm -f $OUT/$set.r$k.jsonl
  run $FF bench coll --colls ag,rs --algos $algos -b 4K -e 64K -f 4 -n 15 -w 1 \
      --place out --json $OUT/$set.r$k.jsonl > $OUT/$set.r$k.coll.txt 2>&1
  echo "$set r$k rc $?"
done; done
