#!/bin/sh
# All-reduces on one node (this 2-core VM) with the built-in model: what
# AUTO picks (rec-whole for short vectors) against the ring, Rabenseifner
# (rec) and Open MPI. 3 runs each of 2 ranks (4 KiB to 64 MiB: on 2 ranks
# rec-whole moves the ring's bytes but adds twice as many) and of 4 and 8
# ranks (oversubscribed; 8 B to 256 KiB).
#   usage: bench/results/coll/one-node-ar/run.sh [build dir]   (from the repo root)
set -eu
FF=${1:-build}/fourfold
OUT=$(dirname "$0")
rm -f "$OUT"/np2.jsonl "$OUT"/np4.jsonl "$OUT"/np8.jsonl # --json appends
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for run in 1 2 3; do
    mpirun -np 2 --mca mpi_yield_when_idle 1 "$FF" bench coll \
        --colls allreduce --algos mpi,ring,rec,rec-whole,auto --place out \
        -b 4K -e 64M -f 4 -n 10 -w 3 --json "$OUT/np2.jsonl" > "$OUT/np2-run$run.txt"
    for np in 4 8; do
        mpirun -np $np --oversubscribe --mca mpi_yield_when_idle 1 "$FF" bench coll \
            --colls allreduce --algos mpi,ring,rec,rec-whole,auto --place out \
            -b 8 -e 256K -f 4 -n 40 -w 10 --json "$OUT/np$np.jsonl" > "$OUT/np$np-run$run.txt"
    done
done
