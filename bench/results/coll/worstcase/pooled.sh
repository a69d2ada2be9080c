#!/bin/sh
# Every profile's choices priced on the same 12 runs per configuration (the
# sweeps in bench/results/coll/direct, direct/one-repeat, multijob and
# worstcase, all with every algorithm timed), as multijob/pooled.sh, with
# the profiles tuned by the worst case over 5 jobs (this directory) added.
#   usage (from the repository root, as root): bench/results/coll/worstcase/pooled.sh [build dir]
set -eu
R=bench/results/coll
exec bench/coll_pooled.sh "${1:-build}" \
  "model=- shipped=profiles one-repeat=$R/direct/one-repeat direct=$R/direct multijob=$R/multijob worstcase=$R/worstcase" \
  "$R/direct $R/direct/one-repeat $R/multijob $R/worstcase"
