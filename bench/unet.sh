#!/bin/sh
# Issue 51's measurements of the U-Net (docs/unet.md, "What is left"), two
# modes:
#  steps  fourfold's `unet-fmnist` training step (B images; 1 rank of 1
#         thread, the 2-rank grids of GRIDS2, the 8-rank grids of GRIDS8)
#         alternating, within each of ROUNDS rounds, with PyTorch's step of
#         the same U-Net on 1 and 2 threads (bench/unet_torch_bench.py: the
#         model of tools/unet_oracle.py in float32, the OpenBLAS fourfold
#         loads through LD_LIBRARY_PATH, OMP_WAIT_POLICY=PASSIVE: its best).
#         fourfold's step time is the median of its log.jsonl's step times
#         ("ms", rank 0's) over REPS steps after 2 warm-ups of a `fourfold
#         train` run (no validation: --data without --val-data; its
#         samples.png in 1 reverse step, after the timed steps). The grids
#         of 8 ranks on a machine of fewer cores run oversubscribed and are
#         labelled so: their times are this machine's, not a cluster's.
#         Prints the median over rounds per configuration and PyTorch /
#         fourfold on the same cores (> 1: fourfold faster); checks first
#         that both models have the same parameter count.
#  loss   the small U-Net's loss over a real training run: LOSS_STEPS
#         (default 200) steps of unet-fmnist, B images, lr 2e-3, the same
#         seed, on 1 rank and on GRID8 (default 2x2x2x1), validation every
#         50 steps on 4 batches of the test images; one SVG of both runs'
#         curves (tools/loss_svg.py, windows of 10 steps) and a table: the
#         windows' mean losses side by side, the largest difference of a
#         step's loss, the validation losses.
# The first lines printed are the machine (cores, load, CPU model, its
# avx512f/avx2 flags, the OpenBLAS core fourfold's library picks). Raw
# output OUTSIDE the source tree, in $OUT (default
# ${FF_BENCH_OUT:-/tmp/fourfold-bench}/unet): unet.jsonl (every run), the
# runs' folders, unet_loss.svg. B (16), REPS (5), ROUNDS (3), GRIDS2
# ("1x1x1x2 1x1x2x1 2x1x1x1"), GRIDS8 ("1x1x8x1 1x1x4x2 2x2x2x1 1x1x1x8",
# or "all": the 20 grids), MODEL (unet-fmnist; unet-tiny to try the script
# quickly).
#   usage: bench/unet.sh [build-dir] [steps|loss|all]
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${1:-build}
WHICH=${2:-all}
BIN=$PWD/$BUILD/fourfold
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/unet}
B=${B:-16}
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-3}
MODEL=${MODEL:-unet-fmnist}
GRIDS2=${GRIDS2:-1x1x1x2 1x1x2x1 2x1x1x1}
GRIDS8=${GRIDS8:-1x1x8x1 1x1x4x2 2x2x2x1 1x1x1x8}
GRID8=${GRID8:-2x2x2x1}
LOSS_STEPS=${LOSS_STEPS:-200}
PY=/usr/bin/python3
MNIST=${FF_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
. scripts/env.sh
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ -x "$BIN" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
[ -e "$MNIST/train-images-idx3-ubyte.gz" ] ||
    { echo "no Fashion-MNIST in $MNIST (scripts/setup.sh installs it)" >&2; exit 1; }
case $WHICH in steps | loss | all) ;; *) echo "usage: bench/unet.sh [build-dir] [steps|loss|all]" >&2; exit 2 ;; esac
[ "$GRIDS8" = all ] && GRIDS8=$("$PY" -c 'print(" ".join(f"{x}x{y}x{z}x{8 // (x * y * z)}"
    for x in (1, 2, 4, 8) for y in (1, 2, 4, 8) for z in (1, 2, 4, 8) if 8 % (x * y * z) == 0))')
mkdir -p "$OUT"
JSONL=$OUT/unet.jsonl
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
    "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { case " ${flags#*:} " in *" $1 "*) echo yes ;; *) echo no ;; esac; }
blas=$(ldd "$BIN" | awk '/libopenblas/ { print $3; exit }')
core=$([ -n "$blas" ] && "$PY" -c 'import ctypes, sys
f = ctypes.CDLL(sys.argv[1]).openblas_get_corename
f.restype = ctypes.c_char_p
print(f().decode())' "$blas" 2>/dev/null || echo unknown)
echo "# $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1): avx512f $(has avx512f)," \
    "avx2 $(has avx2); OpenBLAS core $core (${blas:-no libopenblas}); $MODEL, $B images a step"

# ff LABEL GRID [train options]: a run of 2 + REPS steps; prints "median_ms params"
ff() {
    label=$1 grid=$2
    shift 2
    np=$(echo "$grid" | tr x '\n' | awk 'BEGIN { p = 1 } { p *= $1 } END { print p }')
    dir=$OUT/run-$grid
    OPENBLAS_NUM_THREADS=1 mpirun --bind-to none -np "$np" "$BIN" train --model "$MODEL" \
        --grid "$grid" --threads 1 --batch "$B" --steps $((REPS + 2)) --lr 2e-3 \
        --data "$MNIST/train-images-idx3-ubyte.gz" --sample-steps 1 --log-every 1000 \
        --out "$dir" --overwrite "$@" > "$OUT/run.txt" 2>&1 ||
        { cat "$OUT/run.txt" >&2; echo "unet.sh: the fourfold run on $grid failed" >&2; exit 1; }
    "$PY" - "$dir/log.jsonl" "$label" "$grid" "$np" "$(nproc)" >> "$JSONL.tmp" <<'EOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
cfg = next(l for l in lines if l.get("type") == "config" or "params" in l)
ms = [l["ms"] for l in lines if l.get("type") == "step"][2:]
np_, cores = int(sys.argv[4]), int(sys.argv[5])
print(json.dumps({"peer": "fourfold", "label": sys.argv[2], "grid": sys.argv[3], "ranks": np_,
                  "oversubscribed": np_ > cores, "params": cfg.get("params"),
                  "median_ms": statistics.median(ms), "runs_ms": ms}))
EOF
    tail -1 "$JSONL.tmp" | "$PY" -c 'import json, sys; j = json.loads(sys.stdin.read())
print(j["median_ms"], j["params"])'
}
# pt LABEL THREADS: PyTorch's step; prints "median_ms params"
pt() {
    label=$1 th=$2
    LD_LIBRARY_PATH=${blas:+$(dirname "$blas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=$th "$PY" bench/unet_torch_bench.py \
        --preset "${MODEL#unet-}" --B "$B" --threads "$th" --warmup 2 --iters "$REPS" \
        > "$OUT/pt.txt" 2>&1 ||
        { cat "$OUT/pt.txt" >&2; echo "unet.sh: the PyTorch peer failed" >&2; exit 1; }
    grep '^{' "$OUT/pt.txt" | sed "s/^{/{\"label\":\"$label\",/" | tee -a "$JSONL.tmp" |
        "$PY" -c 'import json, sys; j = json.loads(sys.stdin.read())
print(j["median_ms"], j["params"])'
}
med() { sort -n | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

: > "$JSONL.tmp"
if [ "$WHICH" != loss ]; then
    rm -f "$OUT"/t.*
    r=0
    while [ $r -lt "$ROUNDS" ]; do
        ff "fourfold 1 rank" 1x1x1x1 > "$OUT/o"
        read -r ms pf < "$OUT/o"
        echo "$ms" >> "$OUT/t.ff1"
        pt "pytorch 1 thread" 1 > "$OUT/o"
        read -r ms pp < "$OUT/o"
        echo "$ms" >> "$OUT/t.pt1"
        [ "$pf" = "$pp" ] || { echo "unet.sh: fourfold's $MODEL has $pf parameters, PyTorch's $pp" >&2; exit 1; }
        for g in $GRIDS2; do
            ff "fourfold 2 ranks" "$g" | cut -d' ' -f1 >> "$OUT/t.ff2.$g"
        done
        pt "pytorch 2 threads" 2 | cut -d' ' -f1 >> "$OUT/t.pt2"
        for g in $GRIDS8; do
            ff "fourfold 8 ranks" "$g" | cut -d' ' -f1 >> "$OUT/t.ff8.$g"
        done
        r=$((r + 1))
    done
    echo "parameters: $pf (fourfold) = $pp (PyTorch)"
    p1=$(med < "$OUT/t.pt1") p2=$(med < "$OUT/t.pt2")
    printf '%-38s %-9s %6s %12s %12s %9s  %s\n' configuration grid cores fourfold_ms pytorch_ms ratio \
        "(medians of $ROUNDS rounds; ratio = pytorch / fourfold)"
    row() { # label grid cores ff-file pytorch-median
        f=$(med < "$4")
        printf '%-38s %-9s %6s %12.1f %12s %9s\n' "$1" "$2" "$3" "$f" "${5:--}" \
            "$([ -n "${5:-}" ] && awk -v p="$5" -v f="$f" 'BEGIN { printf "%.2f", p / f }' || echo -)"
    }
    row "1 rank, 1 thread" 1x1x1x1 1 "$OUT/t.ff1" "$p1"
    for g in $GRIDS2; do row "2 ranks" "$g" 2 "$OUT/t.ff2.$g" "$p2"; done
    over=$([ "$(nproc)" -lt 8 ] && echo " (oversubscribed on $(nproc) cores)" || true)
    for g in $GRIDS8; do row "8 ranks$over" "$g" "$(nproc)" "$OUT/t.ff8.$g"; done
    rm -f "$OUT"/t.* "$OUT/o"
fi
if [ "$WHICH" != steps ]; then
    for np in 1 8; do
        g=$([ $np = 1 ] && echo 1x1x1x1 || echo "$GRID8")
        OPENBLAS_NUM_THREADS=1 mpirun --bind-to none -np $np "$BIN" train --model "$MODEL" \
            --grid "$g" --threads 1 --batch "$B" --steps "$LOSS_STEPS" --lr 2e-3 --warmup 20 \
            --seed 1337 --val-every 50 --val-batches 4 --sample-steps 1 --log-every 50 \
            --out "$OUT/loss-$np" --overwrite > "$OUT/loss-$np.txt" 2>&1 ||
            { cat "$OUT/loss-$np.txt" >&2; echo "unet.sh: the loss run on $g failed" >&2; exit 1; }
    done
    "$PY" tools/loss_svg.py "$OUT/unet_loss.svg" "1 rank=$OUT/loss-1/log.jsonl" \
        "8 ranks, $GRID8=$OUT/loss-8/log.jsonl" --window 10 \
        --title "$MODEL, $LOSS_STEPS steps of $B images: 1 rank and 8 ranks"
    "$PY" - "$OUT/loss-1/log.jsonl" "$OUT/loss-8/log.jsonl" "$GRID8" <<'EOF'
import json, sys
def read(path):
    steps, val = {}, {}
    for l in map(json.loads, open(path)):
        if l.get("type") == "step":
            steps[l["step"]] = l["loss"]
        elif l.get("type") == "val":
            val[l["step"]] = l["val_loss"]
    return steps, val
(s1, v1), (s8, v8) = read(sys.argv[1]), read(sys.argv[2])
print(f"{'steps':>10} {'1 rank':>10} {'8 ranks':>10}   (mean training loss; 8 ranks: {sys.argv[3]})")
n = max(s1)
for a in range(1, n + 1, 10):
    w = [k for k in range(a, min(a + 10, n + 1)) if k in s1 and k in s8]
    if w:
        print(f"{a:>4}-{w[-1]:<5} {sum(s1[k] for k in w) / len(w):10.4f} "
              f"{sum(s8[k] for k in w) / len(w):10.4f}")
d = max((abs(s1[k] - s8[k]), k) for k in s1 if k in s8)
print(f"largest difference of a step's loss: {d[0]:.3g} at step {d[1]}")
for k in sorted(v1):
    print(f"validation at step {k}: 1 rank {v1[k]:.4f}, 8 ranks {v8.get(k, float('nan')):.4f}")
EOF
    echo "the curves: $OUT/unet_loss.svg"
fi
cat "$JSONL.tmp" >> "$JSONL"
rm -f "$JSONL.tmp"
echo "JSON lines appended to $JSONL"
