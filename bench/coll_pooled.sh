#!/bin/sh
# Several profiles' choices priced on the same runs: for each profile
# directory, bench/coll_picks.sh writes the algorithm AUTO runs at each
# size under it (NAME.picks.jsonl, nodes pretended on this machine), and
# bench/coll_table.py prices those at the times measured for them in the
# runs of every EVAL directory (NAME.rK.jsonl, every algorithm timed).
# "model" stands for the shipped profiles without their picks.
#   usage (from the repository root): bench/coll_pooled.sh BUILD "LABEL=DIR ..." "EVAL ..."
#   e.g. bench/coll_pooled.sh build "model=- shipped=profiles" "bench/results/coll/direct"
set -eu
B=$1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
mkdir -p $OUT/model-profiles
for p in profiles/tb-*.json; do # the model alone: the shipped profiles without picks
  python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); p.pop("picks", None); json.dump(p, open(sys.argv[2], "w"))' \
    $p $OUT/model-profiles/$(basename $p)
done
for v in $2; do
  label=${v%%=*} dir=${v#*=} shown=${v#*=}
  [ "$label" = model ] && dir=$OUT/model-profiles shown="profiles/ without picks"
  bench/coll_picks.sh $B $dir $OUT/$label 4M > /dev/null
  for name in tb-2x2-1gbit-d0us tb-2x2-1gbit-d100us tb-4x1-1gbit-d0us tb-4x1-1gbit-d100us; do
    echo "== $label ($shown): $name"
    runs=
    for e in $3; do runs="$runs $e/$name.r*.jsonl"; done
    python3 bench/coll_table.py $runs $OUT/$label/$name.picks.jsonl | grep "^Pick vs"
  done
done
