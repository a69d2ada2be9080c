#!/bin/sh
# The mixture-of-experts measurements of docs/moe.md (issue 27).
#
#   bench/moe.sh comm [build-dir]
#     DTD and CAC on an emulated cluster of 2 nodes x 2 ranks at 1 Gbit/s
#     (bench/cluster.sh, docs/design.md §8): one training step
#     (bench/gpt.c) of L=2 C=256 NH=4 V=512 T=128 B=8 with 4 experts in
#     both blocks, top-2, capacity factor 1.25, on 2x1x1x2 with expert
#     parallelism 2: X inside a node, the expert group (D) across the
#     nodes. Variants, alternating, ROUNDS times, each run the median of
#     REPS steps after 2 warm-ups:
#       base  DTD off              dtd   DTD on
#       ckpt  DTD on, checkpointing    cac   DTD on, checkpointing with CAC
#     Prints per variant the median step time, the ms per step rank 0 waited
#     in the all-to-alls and in the X all-gathers, and ratios to base (dtd)
#     and to ckpt (cac). Needs root (the emulated cluster). About 3 minutes.
#
#   bench/moe.sh quality [build-dir]
#     mini-moe against mini (dense) on the fortunes corpus, STEPS (default
#     300) steps each, the same seed and batch: top-1 routing sends each
#     token through one expert of the dense MLP's shape, so both do the same
#     FLOPs per token but the router's. Prints the validation loss at the
#     end and tokens per second (median over the run's steps), each model run
#     alternately ROUNDS (default 2) times on 1 rank. About 4 minutes.
#
# Raw output goes outside the source tree, to $OUT (default
# ${FF_BENCH_OUT:-/tmp/fourfold-bench}/moe-MODE.jsonl).
set -eu
case ${1:-} in -h | --help | "") sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
MODE=$1
cd "$(dirname "$0")/.."
BUILD=${2:-build}
BIN=$PWD/$BUILD/bench/ff_bench_gpt
CLI=$PWD/$BUILD/fourfold
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/moe-$MODE.jsonl}
[ -x "$BIN" ] && [ -x "$CLI" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
. scripts/env.sh
mkdir -p "$(dirname "$OUT")"
: > "$OUT.tmp"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"

case $MODE in
comm)
    CLUSTER=$PWD/bench/cluster.sh
    "$CLUSTER" --check || exit 2
    REPS=${REPS:-5}
    ROUNDS=${ROUNDS:-3}
    for r in $(seq "$ROUNDS"); do
        for v in base dtd ckpt cac; do
            case $v in
            base) args="--dtd 0" ;;
            dtd) args="--dtd 1" ;;
            ckpt) args="--dtd 1 --checkpoint" ;;
            cac) args="--dtd 1 --checkpoint --cac 1" ;;
            esac
            "$CLUSTER" -n 2 -m 2 -r 1gbit "$BIN" --grid 2x1x1x2 --L 2 --C 256 --NH 4 --V 512 \
                --maxT 128 --B 8 --T 128 --experts 4 --expert-every 1 --top-k 2 --ep 2 \
                --reps "$REPS" $args --label "$v round $r" 2>&1 | grep '^{' |
                sed "s/^{/{\"variant\":\"$v\",/" >> "$OUT.tmp"
        done
    done
    python3 - "$OUT.tmp" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for v in ("base", "dtd", "ckpt", "cac"):
    rs = [r for r in rows if r["variant"] == v]
    med[v] = {k: statistics.median(r[k] for r in rs)
              for k in ("median_ms", "alltoall_wait_ms", "x_allgather_wait_ms")}
print("2 nodes x 2 ranks, 1 Gbit/s; grid 2x1x1x2, expert parallelism 2 across the nodes; "
      "medians over rounds (ms per step)")
print(f"{'variant':>8} {'step':>9} {'all-to-all wait':>16} {'X all-gather wait':>18}")
for v, m in med.items():
    print(f"{v:>8} {m['median_ms']:9.1f} {m['alltoall_wait_ms']:16.1f} {m['x_allgather_wait_ms']:18.1f}")
b, d, c, a = med["base"], med["dtd"], med["ckpt"], med["cac"]
print(f"DTD: step {d['median_ms'] / b['median_ms']:.2f} of base, all-to-all wait "
      f"{d['alltoall_wait_ms'] / b['alltoall_wait_ms']:.2f} of base")
print(f"CAC: step {a['median_ms'] / c['median_ms']:.2f} of checkpointing without it, all-to-all "
      f"wait {a['alltoall_wait_ms'] / c['alltoall_wait_ms']:.2f}")
PY
    ;;
quality)
    STEPS=${STEPS:-300}
    ROUNDS=${ROUNDS:-2}
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    for r in $(seq "$ROUNDS"); do
        for m in mini mini-moe; do
            mpirun -np 1 "$CLI" train --model "$m" --grid 1x1x1x1 --steps "$STEPS" --batch 16 \
                --seq 64 --lr 1e-3 --warmup 20 --val-every 0 --val-batches 16 --seed 7 \
                --out "$WORK/$m" --overwrite > "$WORK/out" 2>&1 ||
                { cat "$WORK/out"; exit 1; }
            python3 - "$WORK/$m/log.jsonl" "$m" "$r" >> "$OUT.tmp" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if r["type"] == "step"]
val = [r for r in rows if r["type"] == "val"][-1]
print(json.dumps({"model": sys.argv[2], "round": int(sys.argv[3]), "steps": len(steps),
                  "val_loss": val["val_loss"], "train_loss": steps[-1]["loss"],
                  "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps[10:]),
                  "aux_loss": steps[-1].get("aux_loss"), "dropped": steps[-1].get("dropped")}))
PY
        done
    done
    python3 - "$OUT.tmp" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'model':>9} {'val loss':>9} {'train loss':>10} {'tokens/s':>9}  (medians over rounds)")
res = {}
for m in ("mini", "mini-moe"):
    rs = [r for r in rows if r["model"] == m]
    res[m] = {k: statistics.median(r[k] for r in rs) for k in ("val_loss", "train_loss", "tokens_per_s")}
    print(f"{m:>9} {res[m]['val_loss']:9.4f} {res[m]['train_loss']:10.4f} {res[m]['tokens_per_s']:9.0f}")
print(f"mini-moe / mini: validation loss {res['mini-moe']['val_loss'] / res['mini']['val_loss']:.3f}, "
      f"tokens/s {res['mini-moe']['tokens_per_s'] / res['mini']['tokens_per_s']:.2f}")
PY
    ;;
*) echo "usage: bench/moe.sh comm|quality [build-dir]" >&2; exit 2 ;;
esac
cat "$OUT.tmp" >> "$OUT"
rm -f "$OUT.tmp"
echo "JSON lines appended to $OUT"
