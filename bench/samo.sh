#!/bin/sh
# The pruning measurements of docs/samo.md (issue 28).
#
#   TB=.../tbcluster.sh bench/samo.sh dp [build-dir]
#     The data-parallel all-reduce of masked training against the dense one
#     on an emulated cluster of 2 nodes x 2 ranks at 1 Gbit/s (the external
#     cluster emulator whose tbcluster.sh TB names, docs/design.md §8): the
#     mini model (L=4 C=128), trained 20 steps and pruned to SPARSITY
#     (default 0.9, global), then STEPS (default 12) steps on 1x1x2x2 (Z
#     inside a node, D across the nodes) from that checkpoint, dense and with
#     its mask, alternately ROUNDS (default 3) times. Prints per variant the
#     median step time and the time rank 0 waited in collectives (steps 3 on,
#     medians over rounds) and their ratios. Needs root and TB. About 3
#     minutes.
#
#   bench/samo.sh quality [build-dir]
#     mini trained STEPS (default 400) steps dense, and the same run pruned
#     iteratively to SPARSITY (default 0.8) in 4 rounds in its first half
#     (--prune-to, --prune-every STEPS/8), on the fortunes corpus, 1 rank:
#     the validation loss at the end of each. About 1 minute.
#
# Raw output goes outside the source tree, to $OUT (default
# ${FF_BENCH_OUT:-/tmp/fourfold-bench}/samo-MODE.jsonl).
set -eu
case ${1:-} in -h | --help | "") sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
MODE=$1
cd "$(dirname "$0")/.."
BUILD=${2:-build}
CLI=$PWD/$BUILD/fourfold
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/samo-$MODE.jsonl}
[ -x "$CLI" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
. scripts/env.sh
mkdir -p "$(dirname "$OUT")"
: > "$OUT.tmp"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
SPARSITY=${SPARSITY:-}

# the median step time and collective wait of a run's steps 3 on
summarise() { # log.jsonl variant round
    python3 - "$@" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if r["type"] == "step"][2:]
vals = [r for r in rows if r["type"] == "val"]
print(json.dumps({"variant": sys.argv[2], "round": int(sys.argv[3]),
                  "ms": statistics.median(r["ms"] for r in steps),
                  "wait_ms": statistics.median(r["wait_ms"] for r in steps),
                  "val_loss": vals[-1]["val_loss"] if vals else None}))
PY
}

case $MODE in
dp)
    TB=${TB:-}
    [ -n "$TB" ] || { echo "set TB to the cluster emulator's tbcluster.sh (docs/design.md §8)" >&2; exit 2; }
    STEPS=${STEPS:-12}
    ROUNDS=${ROUNDS:-3}
    P=${SPARSITY:-0.9}
    mpirun -np 1 "$CLI" train --model mini --steps 20 --val-every 0 --out "$WORK/base" > "$WORK/out" 2>&1 ||
        { cat "$WORK/out"; exit 1; }
    mpirun -np 1 "$CLI" prune --checkpoint "$WORK/base/model_00000020.bin" --sparsity "$P" \
        --out "$WORK/pruned.bin" | tee "$WORK/prune.out" | head -1
    for r in $(seq "$ROUNDS"); do
        for v in dense masked; do
            mask=""
            [ "$v" = masked ] && mask="--mask auto"
            "$TB" -n 2 -m 2 -r 1gbit all -- "$CLI" train --grid 1x1x2x2 --steps "$STEPS" \
                --init-from "$WORK/pruned.bin" $mask --data "$WORK/base/corpus/fortunes_train.bin" \
                --val-every 0 --overwrite --out "$WORK/$v" > "$WORK/out" 2>&1 ||
                { cat "$WORK/out"; exit 1; }
            summarise "$WORK/$v/log.jsonl" "$v" "$r" >> "$OUT.tmp"
        done
    done
    python3 - "$OUT.tmp" "$P" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {v: {k: statistics.median(r[k] for r in rows if r["variant"] == v) for k in ("ms", "wait_ms")}
       for v in ("dense", "masked")}
print(f"mini pruned to {sys.argv[2]}; 2 nodes x 2 ranks, 1 Gbit/s; grid 1x1x2x2 (D across the "
      "nodes); medians of steps 3 on, then over rounds")
print(f"{'variant':>8} {'step ms':>9} {'wait ms':>9}")
for v, m in med.items():
    print(f"{v:>8} {m['ms']:9.1f} {m['wait_ms']:9.1f}")
print(f"masked / dense: step {med['masked']['ms'] / med['dense']['ms']:.2f}, "
      f"wait {med['masked']['wait_ms'] / med['dense']['wait_ms']:.2f}")
PY
    ;;
quality)
    STEPS=${STEPS:-400}
    P=${SPARSITY:-0.8}
    EVERY=$((STEPS / 8))
    for v in dense pruned; do
        extra=""
        [ "$v" = pruned ] && extra="--prune-to $P --prune-every $EVERY --prune-steps 4"
        mpirun -np 1 "$CLI" train --model mini --steps "$STEPS" --batch 16 --seq 64 --lr 1e-3 \
            --warmup 20 --val-every 0 --val-batches 16 --seed 7 $extra --out "$WORK/$v" \
            > "$WORK/out" 2>&1 || { cat "$WORK/out"; exit 1; }
        grep "pruning round" "$WORK/out" || true
        summarise "$WORK/$v/log.jsonl" "$v" 1 >> "$OUT.tmp"
    done
    python3 - "$OUT.tmp" "$P" "$STEPS" <<'PY'
import json, sys
rows = {r["variant"]: r for r in map(json.loads, open(sys.argv[1]))}
print(f"mini, {sys.argv[3]} steps on the fortunes, 1 rank; pruned: to {sys.argv[2]} in 4 rounds "
      "in the first half")
for v in ("dense", "pruned"):
    print(f"{v:>7}: validation loss {rows[v]['val_loss']:.4f}")
print(f"pruned / dense: {rows['pruned']['val_loss'] / rows['dense']['val_loss']:.3f}")
PY
    ;;
*) echo "usage: bench/samo.sh dp|quality [build-dir]" >&2; exit 2 ;;
esac
cat "$OUT.tmp" >> "$OUT"
