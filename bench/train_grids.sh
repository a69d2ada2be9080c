#!/bin/sh
# Every grid of NP ranks, measured against the planner (issue 6, "Time"),
# and with STAGES every (grid, stages, micro-batches) of a pipeline (issue
# 26): runs `fourfold train` for STEPS steps on each configuration, takes the median step
# time of steps 4..STEPS from its log.jsonl, asks `fourfold plan --json` for
# its prediction of the same model, batch and job, and prints both with the
# Spearman rank correlation and the measured time of the planner's first
# choice against the measured best. Writes OUTSIDE the source tree, to
# $OUT (default ${FF_BENCH_OUT:-/tmp/fourfold-bench}/train-grids): NAME.jsonl
# (one line per grid) and NAME.txt (the table printed at the end).
#
#   usage: bench/train_grids.sh [BUILD_DIR] [NAME]        (build, this)
#          bench/train_grids.sh BUILD_DIR OUT_DIR NAME    (OUT_DIR for $OUT)
#   environment:
#     NP=8 STEPS=30               ranks, steps per grid
#     MODEL="--model mini"        model flags (train and plan take the same)
#     BATCH=16 SEQ=64             global batch, tokens per sequence
#     STAGES=1 MICRO=1            pipeline stages and micro-batches, as
#                                 `fourfold plan` takes them (auto: every P,
#                                 the fastest M of each grid)
#     MACHINE=this                the planner's profile (name or FILE.json)
#     RPN=NP                      ranks per node, as the planner sees it
#     TB="N M RATE DELAY"         run on an emulated cluster of N nodes x M
#                                 ranks, links of RATE (tc's syntax) with
#                                 DELAY us one-way, instead of one namespace
#                                 (bench/cluster.sh, docs/design.md §8; needs
#                                 root)
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
BUILD=$(cd "${1:-build}" && pwd)
NAME=${2:-this}
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/train-grids}
if [ $# -ge 3 ]; then OUT=$2 NAME=$3; fi
NP=${NP:-8}
STEPS=${STEPS:-30}
MODEL=${MODEL:---model mini}
BATCH=${BATCH:-16}
SEQ=${SEQ:-64}
MACHINE=${MACHINE:-this}
STAGES=${STAGES:-1}
MICRO=${MICRO:-1}
RPN=${RPN:-$NP}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -n "${TB:-}" ]; then
    # shellcheck disable=SC2086
    set -- $TB
    [ $# = 4 ] || { echo "TB wants \"NODES RANKS RATE DELAY\", e.g. TB=\"2 2 1gbit 0\"" >&2; exit 2; }
    SHAPE="-p fftrain -s 10.78.0 -n $1 -m $2 -r $3 -d $4"
    # shellcheck disable=SC2086
    "$HERE/cluster.sh" $SHAPE --check || exit 2
fi
FF=$BUILD/fourfold
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
. "$HERE/../scripts/env.sh"
export OMPI_MCA_mpi_yield_when_idle=1

# the same corpus for every grid: the fortunes, tokenized once
"$FF" tokenize --doc-sep % --val-fraction 0 --out "$WORK/f" \
    $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort) > /dev/null

"$FF" plan $MODEL --batch "$BATCH" --seq "$SEQ" --ranks "$NP" --ranks-per-node "$RPN" \
    --machine "$MACHINE" --checkpoint off --stages "$STAGES" --micro-batches "$MICRO" \
    --json > "$WORK/plan.json"
python3 - "$WORK/plan.json" > "$WORK/grids" <<'EOF'
import json, sys
for g in json.load(open(sys.argv[1]))["grids"]:
    if not g["rejected"]:
        print(g["grid"], g["stages"], g["micro_batches"])
EOF

launch() { # fourfold ARGS... on NP ranks, here or on the emulated cluster
    if [ -n "${TB:-}" ]; then
        # shellcheck disable=SC2086
        "$HERE/cluster.sh" $SHAPE -- --mca btl_tcp_links 2 "$FF" "$@"
    else
        mpirun -np "$NP" --bind-to none "$FF" "$@"
    fi
}

: > "$OUT/$NAME.jsonl"
echo "load before: $(cat /proc/loadavg)" > "$OUT/$NAME.txt"
while read -r grid stages micro; do
    rm -rf "$WORK/run"
    if launch train $MODEL --grid "$grid" --stages "$stages" --micro-batches "$micro" \
        --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" \
        --data "$WORK/f_train.bin" --val-every 0 --log-every 1000000 --out "$WORK/run" \
        < /dev/null > "$WORK/train.out" 2>&1; then
        python3 - "$WORK/run/log.jsonl" "$grid P$stages M$micro" >> "$OUT/$NAME.jsonl" <<'EOF'
import json, statistics, sys
ms = [r["ms"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"][3:]
print(json.dumps({"grid": sys.argv[2], "median_ms": statistics.median(ms),
                  "min_ms": min(ms), "max_ms": max(ms), "steps": len(ms)}))
EOF
    else
        echo "$grid P$stages M$micro failed:" >&2
        tail -5 "$WORK/train.out" >&2
    fi
done < "$WORK/grids"
echo "load after: $(cat /proc/loadavg)" >> "$OUT/$NAME.txt"

python3 - "$WORK/plan.json" "$OUT/$NAME.jsonl" >> "$OUT/$NAME.txt" <<'EOF'
import json, sys
plan = {f'{g["grid"]} P{g["stages"]} M{g["micro_batches"]}': g
        for g in json.load(open(sys.argv[1]))["grids"] if not g["rejected"]}
meas = {r["grid"]: r for r in map(json.loads, open(sys.argv[2]))}
grids = [g for g in plan if g in meas]
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):  # average ranks of ties
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
pred = [plan[g]["step_s"] * 1e3 for g in grids]
got = [meas[g]["median_ms"] for g in grids]
rp, rm = ranks(pred), ranks(got)
n = len(grids)
mp, mm = sum(rp) / n, sum(rm) / n
cov = sum((a - mp) * (b - mm) for a, b in zip(rp, rm))
rho = cov / (sum((a - mp) ** 2 for a in rp) * sum((b - mm) ** 2 for b in rm)) ** 0.5
print(f"{'grid':16} {'predicted ms':>13} {'measured ms':>12} {'(min..max)':>17} {'rank p':>6} {'rank m':>6}")
for g, p, m, a, b in sorted(zip(grids, pred, got, rp, rm), key=lambda t: t[1]):
    r = meas[g]
    print(f"{g:16} {p:13.1f} {m:12.1f} {r['min_ms']:8.1f}..{r['max_ms']:<8.1f} {a:6.1f} {b:6.1f}")
first = min(grids, key=lambda g: plan[g]["step_s"])
best = min(grids, key=lambda g: meas[g]["median_ms"])
print(f"Spearman rank correlation over {n} grids: {rho:.3f}")
print(f"planner's first choice {first}: {meas[first]['median_ms']:.1f} ms measured; "
      f"measured best {best}: {meas[best]['median_ms']:.1f} ms; "
      f"ratio {meas[first]['median_ms'] / meas[best]['median_ms']:.3f}")
print(json.dumps({"spearman": rho, "first_choice": first, "best": best,
                  "first_over_best": meas[first]["median_ms"] / meas[best]["median_ms"]}))
EOF
cat "$OUT/$NAME.txt"
