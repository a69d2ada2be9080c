#!/bin/sh
# Every profile's choices priced on the same 9 runs per configuration (the
# sweeps in bench/results/coll/direct, direct/one-repeat and multijob, all
# with every algorithm timed): bench/coll_pooled.sh (bench/coll_picks.sh
# writes the algorithm AUTO runs at each size under each profile, nodes
# pretended on this machine, and bench/coll_table.py prices those at the
# times measured for them on the emulated cluster).
#   usage (from the repository root, as root): bench/results/coll/multijob/pooled.sh [build dir]
set -eu
R=bench/results/coll
exec bench/coll_pooled.sh "${1:-build}" \
  "model=- shipped=profiles one-repeat=$R/direct/one-repeat direct=$R/direct multijob=$R/multijob" \
  "$R/direct $R/direct/one-repeat $R/multijob"
