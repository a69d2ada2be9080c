#!/bin/sh
# Does rec-whole change a training step? `fourfold train --model mini` on the
# emulated 2 nodes x 2 ranks (1 Gbit/s, no delay), grid 1x4x1x1 (Y spans both
# nodes: the LayerNorm statistics all-reduce over Y, 2 floats per row),
# 30 steps, default AUTO against FF_STRICT_VOLUME=0, interleaved, 3 runs each;
# median step time of steps 4..30 from log.jsonl. PROFILE=file.json sets
# FF_PROFILE for both (the collective layer's model; default: its built-in).
#   usage (from the repository root, as root): [PROFILE=...] bench/results/coll/whole-ar/train-ab.sh
set -eu
OUT=bench/results/coll/whole-ar
PROFILE=${PROFILE:-}
TAG=${PROFILE:+-$(basename "$PROFILE" .json)}
FF=$PWD/build/fourfold
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$FF" tokenize --doc-sep % --val-fraction 0 --out "$WORK/f" \
    $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort) > /dev/null
: > $OUT/train-ab$TAG.jsonl
for k in 1 2 3; do
for sv in 1 0; do
  rm -rf "$WORK/run"
  TB_MPIRUN_ARGS="--mca btl_tcp_links 2 -x FF_STRICT_VOLUME=$sv ${PROFILE:+-x FF_PROFILE=$PWD/$PROFILE}" \
    ../shared/tools/testbed/tbcluster.sh -p fftrain -s 10.78.0 -n 2 -m 2 -r 1gbit -d 0 all -- \
    "$FF" train --model mini --grid 1x4x1x1 --batch 16 --seq 64 --steps 30 \
    --data "$WORK/f_train.bin" --val-every 0 --log-every 1000000 --out "$WORK/run" \
    < /dev/null > "$WORK/train.out" 2>&1 || { tail -5 "$WORK/train.out"; exit 1; }
  python3 - "$WORK/run/log.jsonl" "$sv" "$k" >> $OUT/train-ab$TAG.jsonl <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
ms = [r["ms"] for r in rows][3:]
print(json.dumps({"strict_volume": int(sys.argv[2]), "run": int(sys.argv[3]),
                  "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
                  "last_loss": rows[-1].get("loss")}))
PY
done; done
cat $OUT/train-ab$TAG.jsonl
