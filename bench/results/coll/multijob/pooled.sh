#!/bin/sh
# Every profile's choices priced on the same 9 runs per configuration (the
# sweeps in bench/results/coll/direct, direct/one-repeat and multijob, all
# with every algorithm timed): bench/coll_picks.sh writes the algorithm
# AUTO runs at each size under each profile (NAME.picks.jsonl, nodes
# pretended on this machine), and bench/coll_table.py prices those at the
# times measured for them on the emulated cluster.
#   usage (from the repository root, as root): bench/results/coll/multijob/pooled.sh [build dir]
set -eu
B=${1:-build}
R=bench/results/coll
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
mkdir -p $OUT/model-profiles
for p in profiles/tb-*.json; do # the model alone: the shipped profiles without picks
  python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); p.pop("picks", None); json.dump(p, open(sys.argv[2], "w"))' \
    $p $OUT/model-profiles/$(basename $p)
done
for v in model shipped one-repeat direct multijob; do
  case $v in
  model) dir=$OUT/model-profiles shown="profiles/ without picks" ;;
  shipped) dir=profiles shown=$dir ;;
  one-repeat) dir=$R/direct/one-repeat shown=$dir ;;
  *) dir=$R/$v shown=$dir ;;
  esac
  bench/coll_picks.sh $B $dir $OUT/$v 4M > /dev/null
  for name in tb-2x2-1gbit-d0us tb-2x2-1gbit-d100us tb-4x1-1gbit-d0us tb-4x1-1gbit-d100us; do
    echo "== $v ($shown): $name"
    python3 bench/coll_table.py $R/direct/$name.r*.jsonl $R/direct/one-repeat/$name.r*.jsonl \
      $R/multijob/$name.r*.jsonl $OUT/$v/$name.picks.jsonl | grep "^Pick vs"
  done
done
