#!/bin/sh
# The GPT training-step benchmark of docs/gpt.md (issue 4): one step
# (forward, backward, clipping, AdamW) of GPT-2 124M shapes (L=12, C=768,
# NH=12, V=50257 padded to 50304, B=4, T=64) and of a small model (L=4,
# C=256, NH=4, B=8, T=64) on 1 rank with 1 and 2 BLAS threads, side by side
# with PyTorch (bench/gpt_torch_bench.py: the same shapes and threads,
# OMP_WAIT_POLICY=PASSIVE, and the OpenBLAS the benchmark's binary loads,
# through LD_LIBRARY_PATH: Debian's torch takes libblas.so.3 from it; with
# OpenBLAS's OpenMP build PyTorch's 124M step on 2 threads took 1533 and
# 1901 ms against 1679 and 2008 with the pthreads one, 2026-11-26),
# alternating, ROUNDS times; and
# on 2 ranks (2x1x1x1, 1x2x1x1, 1x1x2x1, 1x1x1x2). Each run is the median of
# REPS steps after 2 warm-up steps; the table printed gives the median over
# rounds and the ratio PyTorch / fourfold (> 1: fourfold faster). With
# LLMC_DIR set to an llm.c checkout, llm.c's CPU trainer is a third peer
# (bench/llmc_peer.sh: its train_gpt2.c built with its Makefile's flags, on
# a model and token shards that fourfold writes, OMP_NUM_THREADS = the same
# thread count): each round runs fourfold, PyTorch, then llm.c for the same
# model and threads, and the table gets two more columns, llmc_ms and
# llmc/ff (> 1: fourfold faster). llm.c's timed step is its own: forward,
# zero_grad, backward, AdamW, with no gradient clipping. Its inputs and
# builds are kept in LLMC_OUT (default: llmc/ beside $OUT). The first lines
# printed are the machine: cores, load, OPENBLAS_CORETYPE, the CPU's
# avx512f/avx2 flags and the OpenBLAS core the benchmark's library picks. The
# raw JSON lines (every run, every peer) are appended OUTSIDE the source tree,
# to $OUT (default ${FF_BENCH_OUT:-/tmp/fourfold-bench}/gpt.jsonl).
# `long` is the 124M model on one long sequence (B=1, T=1024), where
# attention is a larger share of the step; `all` runs 124m and small. GRIDS
# (default "2x1x1x1 1x2x1x1 1x1x2x1 1x1x1x2") lists the 2-rank grids run.
#   usage: [LLMC_DIR=~/llm.c] [GRIDS=...] bench/gpt.sh [build-dir] [all|124m|small|long]
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
LLMC_DIR=${LLMC_DIR:-}
[ -z "$LLMC_DIR" ] || LLMC_DIR=$(cd "$LLMC_DIR" && pwd) || { echo "no folder LLMC_DIR=$LLMC_DIR" >&2; exit 1; }
cd "$(dirname "$0")/.."
BUILD=${1:-build}
WHICH=${2:-all}
BIN=$PWD/$BUILD/bench/ff_bench_gpt
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/gpt.jsonl}
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-3}
PY=/usr/bin/python3
LLMC_OUT=${LLMC_OUT:-$(dirname "$OUT")/llmc}
. scripts/env.sh
export OMPI_MCA_mpi_yield_when_idle=1
# OMP_WAIT_POLICY=PASSIVE for PyTorch only (its best); fourfold's passes and
# OpenBLAS's OpenMP build share one pool whose brief spin is the point
# (docs/design.md §8), so its runs keep OpenMP's default
[ -x "$BIN" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"
: > "$OUT.tmp"
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
    "avx2 $(has avx2); OpenBLAS core $core (${blas:-no libopenblas})${LLMC_DIR:+; llm.c $LLMC_DIR}"

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
    LD_LIBRARY_PATH=${blas:+$(dirname "$blas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=$th "$PY" bench/gpt_torch_bench.py --threads "$th" --warmup 2 \
        --iters "$REPS" "$@" 2>&1 | grep '^{' | sed "s/^{/{\"label\":\"$label\",/" |
        tee -a "$OUT.tmp" | sed 's/.*"median_ms": *\([0-9.]*\).*/\1/'
}
lc() { # label threads model-args: llm.c's train_gpt2 (bench/llmc_peer.sh)
    label=$1 th=$2
    shift 2
    bench/llmc_peer.sh --build "$BUILD" --out "$LLMC_OUT" --threads "$th" --warmup 2 \
        --steps "$REPS" --label "$label" "$@" > /tmp/ff_gpt_l.$$ 2>&1 ||
        { cat /tmp/ff_gpt_l.$$ >&2; echo "gpt.sh: the llm.c peer failed" >&2; exit 1; }
    grep '^{' /tmp/ff_gpt_l.$$ | tee -a "$OUT.tmp" | sed 's/.*"median_ms":\([0-9.]*\).*/\1/'
}
med() { sort -n | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

M124="--L 12 --C 768 --NH 12 --maxT 1024 --B 4 --T 64"
MSMALL="--L 4 --C 256 --NH 4 --maxT 1024 --B 8 --T 64"
MLONG="--L 12 --C 768 --NH 12 --maxT 1024 --B 1 --T 1024"
GRIDS=${GRIDS:-2x1x1x1 1x2x1x1 1x1x2x1 1x1x1x2}
printf '%-10s %-9s %5s %7s %12s %12s %9s %9s' model grid ranks threads fourfold_ms pytorch_ms ratio fraction
[ -z "$LLMC_DIR" ] || printf ' %12s %9s' llmc_ms llmc/ff
echo
for model in 124m small long; do
    [ "$WHICH" = "$model" ] || { [ "$WHICH" = all ] && [ "$model" != long ]; } || continue
    case $model in 124m) args=$M124 ;; small) args=$MSMALL ;; *) args=$MLONG ;; esac
    [ -z "$LLMC_DIR" ] || bench/llmc_peer.sh --build "$BUILD" --out "$LLMC_OUT" --prepare \
        --steps "$REPS" --warmup 2 $args --V 50257 > /tmp/ff_gpt_l.$$ 2>&1 ||
        { cat /tmp/ff_gpt_l.$$ >&2; echo "gpt.sh: preparing the llm.c peer failed" >&2; exit 1; }
    for th in 1 2; do
        : > /tmp/ff_gpt_f.$$; : > /tmp/ff_gpt_p.$$; : > /tmp/ff_gpt_x.$$; : > /tmp/ff_gpt_c.$$
        r=0
        while [ $r -lt "$ROUNDS" ]; do
            ff "$model 1 rank $th threads" 1x1x1x1 1 $th $args --V 50257 > /tmp/ff_gpt_o.$$
            cut -d' ' -f1 /tmp/ff_gpt_o.$$ >> /tmp/ff_gpt_f.$$
            cut -d' ' -f2 /tmp/ff_gpt_o.$$ >> /tmp/ff_gpt_x.$$
            pt "$model pytorch $th threads" $th $args --V 50304 >> /tmp/ff_gpt_p.$$
            [ -z "$LLMC_DIR" ] || lc "$model llm.c $th threads" $th $args --V 50257 >> /tmp/ff_gpt_c.$$
            r=$((r + 1))
        done
        f=$(med < /tmp/ff_gpt_f.$$) p=$(med < /tmp/ff_gpt_p.$$) x=$(med < /tmp/ff_gpt_x.$$)
        printf '%-10s %-9s %5s %7s %12.1f %12.1f %9.2f %9.3f' $model 1x1x1x1 1 $th $f $p \
            "$(awk -v p="$p" -v f="$f" 'BEGIN { print p / f }')" $x
        [ -z "$LLMC_DIR" ] || { c=$(med < /tmp/ff_gpt_c.$$); printf ' %12.1f %9.2f' "$c" \
            "$(awk -v c="$c" -v f="$f" 'BEGIN { print c / f }')"; }
        echo
    done
    for grid in $GRIDS; do
        ff "$model 2 ranks" $grid 2 1 $args --V 50257 > /tmp/ff_gpt_o.$$
        printf '%-10s %-9s %5s %7s %12.1f %12s %9s %9.3f' $model $grid 2 1 \
            "$(cut -d' ' -f1 /tmp/ff_gpt_o.$$)" - - "$(cut -d' ' -f2 /tmp/ff_gpt_o.$$)"
        [ -z "$LLMC_DIR" ] || printf ' %12s %9s' - -
        echo
    done
done
rm -f /tmp/ff_gpt_?.$$
cat "$OUT.tmp" >> "$OUT"
rm -f "$OUT.tmp"
echo "JSON lines appended to $OUT"
