#!/bin/sh
# The GPT training-step benchmark of docs/gpt.md (issue 4): one step
# (forward, backward, clipping, AdamW) of GPT-2 124M shapes (L=12, C=768,
# NH=12, V=50257 padded to 50304, B=4, T=64) and of a small model (L=4,
# C=256, NH=4, B=8, T=64) on 1 rank with 1 and 2 BLAS threads, side by side
# with PyTorch (bench/gpt_torch_bench.py: the same shapes and threads,
# OMP_WAIT_POLICY=PASSIVE, the same OpenBLAS), alternating, ROUNDS times; and
# on 2 ranks (2x1x1x1, 1x2x1x1, 1x1x2x1, 1x1x1x2). Each run is the median of
# REPS steps after 2 warm-up steps; the table printed gives the median over
# rounds and the ratio PyTorch / fourfold (> 1: fourfold faster). The raw
# JSON lines (every run, both peers) are appended OUTSIDE the source tree, to
# $OUT (default ${FF_BENCH_OUT:-/tmp/fourfold-bench}/gpt.jsonl).
#   usage: bench/gpt.sh [build-dir] [all|124m|small]
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${1:-build}
WHICH=${2:-all}
BIN=$PWD/$BUILD/bench/ff_bench_gpt
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/gpt.jsonl}
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-3}
PY=/usr/bin/python3
. scripts/env.sh
export OMPI_MCA_mpi_yield_when_idle=1 OMP_WAIT_POLICY=PASSIVE
[ -x "$BIN" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"
: > "$OUT.tmp"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
    "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"

ff() { # label grid ranks threads model-args
    label=$1 grid=$2 np=$3 th=$4
    shift 4
    OPENBLAS_NUM_THREADS=$th mpirun --bind-to none -np "$np" "$BIN" --grid "$grid" --threads "$th" \
        --reps "$REPS" --warmup 2 --label "$label" "$@" 2>&1 | grep '^{' | tee -a "$OUT.tmp" |
        sed 's/.*"median_ms":\([0-9.]*\).*"fraction":\([0-9.]*\).*/\1 \2/'
}
pt() { # label threads model-args (V padded as fourfold pads it)
    label=$1 th=$2
    shift 2
    OPENBLAS_NUM_THREADS=$th "$PY" bench/gpt_torch_bench.py --threads "$th" --warmup 2 \
        --iters "$REPS" "$@" 2>&1 | grep '^{' | sed "s/^{/{\"label\":\"$label\",/" |
        tee -a "$OUT.tmp" | sed 's/.*"median_ms": *\([0-9.]*\).*/\1/'
}
med() { sort -n | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

M124="--L 12 --C 768 --NH 12 --maxT 1024 --B 4 --T 64"
MSMALL="--L 4 --C 256 --NH 4 --maxT 1024 --B 8 --T 64"
printf '%-10s %-9s %5s %7s %12s %12s %9s %9s\n' model grid ranks threads fourfold_ms pytorch_ms ratio fraction
for model in 124m small; do
    [ "$WHICH" = all ] || [ "$WHICH" = "$model" ] || continue
    [ "$model" = 124m ] && args=$M124 || args=$MSMALL
    for th in 1 2; do
        : > /tmp/ff_gpt_f.$$; : > /tmp/ff_gpt_p.$$; : > /tmp/ff_gpt_x.$$
        r=0
        while [ $r -lt "$ROUNDS" ]; do
            ff "$model 1 rank $th threads" 1x1x1x1 1 $th $args --V 50257 > /tmp/ff_gpt_o.$$
            cut -d' ' -f1 /tmp/ff_gpt_o.$$ >> /tmp/ff_gpt_f.$$
            cut -d' ' -f2 /tmp/ff_gpt_o.$$ >> /tmp/ff_gpt_x.$$
            pt "$model pytorch $th threads" $th $args --V 50304 >> /tmp/ff_gpt_p.$$
            r=$((r + 1))
        done
        f=$(med < /tmp/ff_gpt_f.$$) p=$(med < /tmp/ff_gpt_p.$$) x=$(med < /tmp/ff_gpt_x.$$)
        printf '%-10s %-9s %5s %7s %12.1f %12.1f %9.2f %9.3f\n' $model 1x1x1x1 1 $th $f $p \
            "$(awk -v p="$p" -v f="$f" 'BEGIN { print p / f }')" $x
    done
    for grid in 2x1x1x1 1x2x1x1 1x1x2x1 1x1x1x2; do
        ff "$model 2 ranks" $grid 2 1 $args --V 50257 > /tmp/ff_gpt_o.$$
        printf '%-10s %-9s %5s %7s %12.1f %12s %9s %9.3f\n' $model $grid 2 1 \
            "$(cut -d' ' -f1 /tmp/ff_gpt_o.$$)" - - "$(cut -d' ' -f2 /tmp/ff_gpt_o.$$)"
    done
done
rm -f /tmp/ff_gpt_?.$$
cat "$OUT.tmp" >> "$OUT"
rm -f "$OUT.tmp"
echo "JSON lines appended to $OUT"
