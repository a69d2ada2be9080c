#!/bin/sh
# Do bench tune and bench coll rank two algorithms differently because of
# what else runs in the interleaved iterations? On the emulated 4x1 cluster
# with the 100 us delay, all-gather and reduce-scatter of 4-64 KiB, with the
# shipped profile, 3 rounds of: bench coll with every algorithm (the set
# bench/coll_tuned_sweep.sh times), bench coll with tune's candidates only
# (ring,rec,direct,hier-ring,hier-rec), and bench tune of the same sizes.
#   usage (from the repository root, as root): bench/results/coll/multijob/context/run.sh [build dir]
set -u
FF=${1:-build}/fourfold
OUT=bench/results/coll/multijob/context
TB=../shared/tools/testbed/tbcluster.sh
name=tb-4x1-1gbit-d100us
run() { TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_PROFILE=$PWD/profiles/$name.json" \
    $TB -p ffcoll -s 10.79.0 -n 4 -m 1 -r 1gbit -d 100 all -- "$@"; }
for k in 1 2 3; do
for set in all ours tune; do
  echo "$set r$k $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
  case $set in
  all)  algos=mpi-blk,mpi,ring,rec,rec-whole,direct,hier-ring,hier-rec,auto ;;
  ours) algos=ring,rec,direct,hier-ring,hier-rec ;;
  esac
  if [ $set = tune ]; then
    run $FF bench tune --profile $PWD/profiles/$name.json --out /tmp/ctx-tune.json \
      -b 4K -e 64K -f 4 -n 15 --repeats 1 > $OUT/tune.r$k.txt 2>&1
  else
    rm -f $OUT/$set.r$k.jsonl
    run $FF bench coll --colls ag,rs --algos $algos -b 4K -e 64K -f 4 -n 15 -w 1 \
      --place out --json $OUT/$set.r$k.jsonl > $OUT/$set.r$k.coll.txt 2>&1
  fi
  echo "   rc $? $(date -u +%T)" >> $OUT/runs.log
done; done
