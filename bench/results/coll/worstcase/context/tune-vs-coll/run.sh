#!/bin/sh
# Do bench tune and bench coll rank rec and direct alike when run in turn?
# 4x1 with the 100 us delay, 4-64 KiB, 5 rounds of: bench tune (one sweep),
# then bench coll with tune's candidates (ring,rec,direct).
#   usage (from the repository root, as root): bench/results/coll/worstcase/context/tune-vs-coll/run.sh
#   rec over direct per round: python3 bench/results/coll/worstcase/context/tune-vs-coll/show.py bench/results/coll/worstcase/context/tune-vs-coll 5
set -u
FF=build/fourfold
OUT=bench/results/coll/worstcase/context/tune-vs-coll
TB=../shared/tools/testbed/tbcluster.sh
name=tb-4x1-1gbit-d100us
run() { TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_PROFILE=$PWD/profiles/$name.json" \
    $TB -p ffcoll -s 10.79.0 -n 4 -m 1 -r 1gbit -d 100 all -- "$@"; }
for k in 1 2 3 4 5; do
  run $FF bench tune --profile $PWD/profiles/$name.json --out /tmp/ctx-tune.json \
      -b 4K -e 64K -f 4 -n 15 --repeats 1 > $OUT/tune.r$k.txt 2>&1
  rm -f $OUT/a.r$k.jsonl
  run $FF bench coll --colls ag,rs,ar --algos ring,rec,direct -b 4K -e 64K -f 4 -n 15 -w 1 \
      --place out --json $OUT/a.r$k.jsonl > $OUT/a.r$k.coll.txt 2>&1
done
