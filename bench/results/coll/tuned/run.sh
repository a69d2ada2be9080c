#!/bin/sh
# Measured picks on the emulated 2x2 and 4x1 clusters (1 Gbit/s, 0 and
# 100 us one-way delay), the sweep of 2026-11-23 23:16-23:29 UTC: `bench
# tune` (one sweep of sizes: the binary had no --repeats yet, and no direct
# algorithm) added picks to a copy of each shipped profile as it was then
# (git show 9f41940:profiles/tb-*.json; later ones already carry picks,
# which tune replaces), then every collective and algorithm of that time,
# AUTO included, 4 KiB to 4 MiB per rank, 3 runs each. Run again, it does
# not reproduce that tuning exactly: today's bench tune also times the
# direct algorithm (ALGOS limits only bench coll's columns).
#   usage (from the repository root, as root): bench/results/coll/tuned/run.sh [build dir]
#   table: python3 bench/coll_table.py bench/results/coll/tuned/tb-*.r*.jsonl
TUNE_ARGS="--repeats 1" ALGOS=mpi-blk,mpi,ring,rec,rec-whole,hier-ring,hier-rec,auto \
    exec bench/coll_tuned_sweep.sh "${1:-build}" bench/results/coll/tuned
