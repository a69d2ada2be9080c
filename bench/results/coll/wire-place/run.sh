#!/bin/sh
# In place against out of place (same run), and the bf16 wire against fp32
# (interleaved runs), on the emulated 2x2 cluster (1 Gbit/s, no delay) with
# the shipped profile: the library's non-blocking collective, fourfold's
# ring, hier-ring and AUTO; all-gather, reduce-scatter (out of place only:
# in place is not defined for it), all-reduce, 4 KiB to 64 MiB; 2 runs each.
#   usage (from the repository root, as root): bench/results/coll/wire-place/run.sh
set -u
TB=../shared/tools/testbed/tbcluster.sh
OUT=bench/results/coll/wire-place
name=tb-2x2-1gbit-d0us
for k in 1 2; do
for wire in fp32 bf16; do
  echo "$name $wire r$k $(date -u +%T) load $(cat /proc/loadavg)" >> $OUT/runs.log
  rm -f $OUT/$name.$wire.r$k.jsonl
  TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_PROFILE=$PWD/profiles/$name.json" $TB -p ffcoll -s 10.79.0 \
    -n 2 -m 2 -r 1gbit -d 0 all -- build/fourfold bench coll --colls ag,rs,ar --algos mpi,ring,hier-ring,auto \
    --wire $wire -b 4K -e 64M -f 4 -n 15 -w 1 --max-seconds 8 --place both \
    --json $OUT/$name.$wire.r$k.jsonl > $OUT/$name.$wire.r$k.coll.txt 2>&1
done; done
echo "EXIT $(date -u +%T)" >> $OUT/runs.log
