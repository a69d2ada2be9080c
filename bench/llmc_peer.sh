#!/bin/sh
# The llm.c peer of bench/gpt.sh (issue 33): llm.c's own CPU trainer,
# train_gpt2.c, timed on a model and token shards that fourfold writes.
#
#   LLMC_DIR=~/llm.c bench/llmc_peer.sh [--L 12 --C 768 --NH 12 --V 50257
#       --maxT 1024 --B 4 --T 64 --threads 1 --steps 5 --warmup 2
#       --build build --out DIR --label TEXT --prepare]
# Every option can also be given in the environment: L C NH V maxT B T
# THREADS STEPS (--reps is a synonym of --steps) WARMUP BUILD OUT; LLMC_DIR
# (required) is a checkout of https://github.com/karpathy/llm.c.
#
# - Inputs, written by fourfold into OUT (default
#   ${FF_BENCH_OUT:-/tmp/fourfold-bench}/llmc) once and kept:
#   token shards `fourfold tokenize --doc-sep %` of the fortune files (the
#   repository's docs where fortunes is not installed): byte tokens 0..256,
#   valid GPT-2 ids, so V must be at least 257; and the model: `fourfold
#   train` of the shape for one step with --lr 0 (AdamW then changes
#   nothing, weight decay included: the file holds fourfold's seed-1337
#   initialisation), its model_00000001.bin in llm.c's gpt2_*.bin v3 format.
#   (Remove OUT to make them again, e.g. after a change of fourfold's init.)
#   They are linked where train_gpt2.c looks for them (gpt2_124M.bin,
#   dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin); there is no
#   gpt2_tokenizer.bin, whose absence llm.c only warns about.
# - The trainer: a copy of LLMC_DIR/train_gpt2.c (LLMC_DIR is never written)
#   built by a copy of llm.c's Makefile (`make train_gpt2`, so with exactly
#   its flags: on Linux `cc -Ofast -march=native -fopenmp -DOMP ... -lgomp`;
#   the Makefile's `CC ?= clang` does not apply under GNU make, whose
#   built-in CC is cc; set CC to change the compiler). Five lines of main()
#   are changed, each checked to match exactly once (the script fails
#   otherwise; the diff is OUT/<run>/train_gpt2.patch): B and T, the step
#   loop `step <= 40` becomes `step < WARMUP+STEPS`, and the validation
#   (every 10 steps) and sampling (every 20) blocks get `0 &&` in their
#   conditions. The step itself is untouched: llm.c times
#   dataloader_next_batch, gpt2_forward, gpt2_zero_grad, gpt2_backward and
#   gpt2_update (AdamW; llm.c's CPU step has no gradient clipping, fourfold's
#   has) with clock_gettime, and prints `step N: train loss X (took Y ms)`.
#   Without the validation before step 0, the first step allocates the
#   activations, gradients and AdamW moments: the WARMUP steps absorb that.
# - Run with OMP_NUM_THREADS=THREADS and OMP_WAIT_POLICY=LLMC_WAIT_POLICY
#   (default active; `unset` leaves it unset). Measured 2026-11-25 on the
#   2-core VM, shared with other benchmarks (L=2 C=64 NH=4 V=50257 B=4 T=64,
#   the median over 3 alternating rounds of each run's median of 5 steps):
#   1 thread: active 318, passive 321, unset 316 ms (no difference);
#   2 threads: active 166, passive 178, unset 188 ms (round medians 166-177,
#   169-207, 165-193). PASSIVE is not faster, so the default is active.
# - Prints each step, then llm.c's first loss beside ln V (fourfold's
#   initialisation gives about ln V; a loss far from it means llm.c did not
#   read the files as fourfold meant them: the script fails), then ONE JSON
#   line: {"peer":"llm.c","commit":..,"L":..,"C":..,"NH":..,"V":..,"B":..,
#   "T":..,"threads":..,"median_ms":..,"runs_ms":[..],"cflags":"..",...}.
#   --prepare only builds the inputs and the trainer.
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
CALLER=$PWD # LLMC_DIR and OUT are relative to the caller's folder, BUILD to the repository
cd "$(dirname "$0")/.."
ROOT=$PWD
L=${L:-12} C=${C:-768} NH=${NH:-12} V=${V:-50257} maxT=${maxT:-1024} B=${B:-4} T=${T:-64}
THREADS=${THREADS:-1} STEPS=${STEPS:-5} WARMUP=${WARMUP:-2} BUILD=${BUILD:-build}
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/llmc}
LABEL=${LABEL:-} PREPARE=0
WAIT=${LLMC_WAIT_POLICY:-active}
die() { echo "llmc_peer.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case $1 in
    --prepare) PREPARE=1; shift; continue ;;
    --L | --C | --NH | --V | --maxT | --B | --T | --threads | --steps | --reps | --warmup | \
        --build | --out | --label)
        [ $# -ge 2 ] || die "$1 needs a value" ;;
    *) die "unknown option '$1' (--help)" ;;
    esac
    case $1 in
    --L) L=$2 ;; --C) C=$2 ;; --NH) NH=$2 ;; --V) V=$2 ;; --maxT) maxT=$2 ;; --B) B=$2 ;;
    --T) T=$2 ;; --threads) THREADS=$2 ;; --steps | --reps) STEPS=$2 ;; --warmup) WARMUP=$2 ;;
    --build) BUILD=$2 ;; --out) OUT=$2 ;; --label) LABEL=$2 ;;
    esac
    shift 2
done
for v in L C NH V maxT B T THREADS STEPS WARMUP; do
    x=$(eval "printf %s \"\${$v}\"")
    case $x in '' | *[!0-9]*) die "$v must be a whole number, not '$x'" ;; esac
done
[ "$STEPS" -ge 1 ] || die "STEPS must be at least 1"
[ "$V" -ge 257 ] || die "V=$V: the shards hold fourfold's byte tokens 0..256, so V must be >= 257"
[ "$T" -le "$maxT" ] || die "T=$T is above maxT=$maxT"
[ $((C % NH)) -eq 0 ] || die "C=$C is not a multiple of NH=$NH"
[ -n "${LLMC_DIR:-}" ] || die "set LLMC_DIR to an llm.c checkout (git clone https://github.com/karpathy/llm.c)"
d=$(cd "$CALLER" && cd "$LLMC_DIR" 2>/dev/null && pwd) || die "LLMC_DIR '$LLMC_DIR' is not a directory"
LLMC_DIR=$d
for f in train_gpt2.c Makefile llmc/utils.h llmc/dataloader.h llmc/tokenizer.h; do
    [ -f "$LLMC_DIR/$f" ] || die "no $f in LLMC_DIR=$LLMC_DIR: not an llm.c checkout"
done
FF=$ROOT/$BUILD/fourfold
[ -x "$FF" ] || die "no $FF: build first (scripts/build.sh $BUILD)"
case $OUT in /*) ;; *) OUT=$CALLER/$OUT ;; esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
N=$((WARMUP + STEPS))

# --- inputs, written by fourfold ---------------------------------------------
data=$OUT/data
if [ ! -f "$data/text_val.bin" ]; then
    mkdir -p "$data"
    fort=$(find /usr/share/games/fortunes -type f ! -name '*.*' 2>/dev/null | sort)
    if [ -n "$fort" ]; then
        # shellcheck disable=SC2086
        "$FF" tokenize --doc-sep % --out "$data/text" $fort >"$data/tokenize.log" 2>&1 ||
            { cat "$data/tokenize.log" >&2; die "fourfold tokenize failed"; }
    else
        "$FF" tokenize --out "$data/text" README.md docs/*.md >"$data/tokenize.log" 2>&1 ||
            { cat "$data/tokenize.log" >&2; die "fourfold tokenize failed"; }
    fi
fi
ntok() { od -An -t d4 -j 8 -N 4 "$1" | tr -d ' '; }
[ "$(ntok "$data/text_val.bin")" -gt $((B * T)) ] ||
    die "B*T=$((B * T)) tokens: more than the validation shard $data/text_val.bin holds"
shape=L$L-C$C-NH$NH-V$V-maxT$maxT
init=$OUT/init/$shape
if [ ! -f "$init/DONE_00000001" ]; then
    mkdir -p "$OUT/init"
    # shellcheck source=scripts/env.sh
    . scripts/env.sh
    seq=$T
    OPENBLAS_NUM_THREADS=1 mpirun --bind-to none -np 1 "$FF" train --layers "$L" --hidden "$C" \
        --heads "$NH" --vocab "$V" --max-seq "$maxT" --batch 1 --seq "$seq" --steps 1 --lr 0 \
        --data "$data/text_train.bin" --val-every 0 --val-batches 1 --threads 1 \
        --out "$init" --overwrite >"$OUT/init/$shape.log" 2>&1 ||
        { cat "$OUT/init/$shape.log" >&2; die "fourfold train (writing the model) failed"; }
    [ -f "$init/DONE_00000001" ] || die "fourfold train wrote no $init/model_00000001.bin"
fi
ff_loss=$(sed -n 's/.*"type":"step","step":1,"loss":\([0-9.eE+-]*\).*/\1/p' "$init/log.jsonl")

# --- the trainer: llm.c's train_gpt2.c and Makefile, five lines patched -------
run=$OUT/run/$shape-B$B-T$T-n$N
mkdir -p "$run/dev/data/tinyshakespeare"
ln -sfn "$init/model_00000001.bin" "$run/gpt2_124M.bin"
ln -sfn "$data/text_train.bin" "$run/dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
ln -sfn "$data/text_val.bin" "$run/dev/data/tinyshakespeare/tiny_shakespeare_val.bin"
ln -sfn "$LLMC_DIR/llmc" "$run/llmc"
cp "$LLMC_DIR/Makefile" "$run/Makefile"
cp "$LLMC_DIR/train_gpt2.c" "$run/train_gpt2.orig.c"
src=$run/train_gpt2.new.c
cp "$run/train_gpt2.orig.c" "$src"
sub() { # BRE-of-the-line sed-replacement BRE-of-the-result: exactly one line each
    n=$(grep -c -- "$1" "$src" || true)
    [ "$n" = 1 ] || die "train_gpt2.c has $n lines matching '$1', expected 1 (llm.c changed?)"
    sed "s/$1/$2/" "$src" >"$src.tmp" && mv "$src.tmp" "$src"
    n=$(grep -c -F -- "$3" "$src" || true)
    [ "$n" = 1 ] || die "patching train_gpt2.c: '$3' matches $n lines after the edit, expected 1"
}
sub '^\([[:space:]]*int B = \)4;' "\\1$B; \\/\\/ fourfold bench: B=$B" "int B = $B; // fourfold bench"
sub '^\([[:space:]]*int T = \)64;' "\\1$T; \\/\\/ fourfold bench: T=$T" "int T = $T; // fourfold bench"
sub '^\([[:space:]]*for (int step = 0; step \)<= 40; step++) {' \
    "\\1< $N; step++) { \\/\\/ fourfold bench: WARMUP+STEPS steps" "step < $N; step++) { // fourfold"
sub '^\([[:space:]]*if (\)step % 10 == 0) {' \
    '\10 \&\& step % 10 == 0) { \/\/ fourfold bench: no validation' 'if (0 && step % 10 == 0)'
sub '^\([[:space:]]*if (\)step > 0 && step % 20 == 0) {' \
    '\10 \&\& step > 0 \&\& step % 20 == 0) { \/\/ fourfold bench: no sampling' \
    'if (0 && step > 0 && step % 20 == 0)'
diff -u "$run/train_gpt2.orig.c" "$src" >"$run/train_gpt2.patch" || true
if [ "$(grep -c '^+[^+]' "$run/train_gpt2.patch")" != 5 ] ||
    [ "$(grep -c '^-[^-]' "$run/train_gpt2.patch")" != 5 ]; then
    die "the patch of train_gpt2.c is not 5 changed lines (see $run/train_gpt2.patch)"
fi
if cmp -s "$src" "$run/train_gpt2.c"; then rm -f "$src"; else mv "$src" "$run/train_gpt2.c"; fi
cmd=$(cd "$run" && make -s -n train_gpt2 2>/dev/null | grep 'train_gpt2\.c' | tail -1)
case $cmd in *-fopenmp*) ;; *) die "llm.c's Makefile found no OpenMP here: '$cmd'" ;; esac
if [ ! -x "$run/train_gpt2" ] || [ "$(cat "$run/cflags" 2>/dev/null)" != "$cmd" ] ||
    [ -n "$(find "$LLMC_DIR/llmc" -newer "$run/train_gpt2" -name '*.h' 2>/dev/null | head -1)" ]; then
    rm -f "$run/train_gpt2"
    (cd "$run" && make train_gpt2) >"$run/make.log" 2>&1 ||
        { cat "$run/make.log" >&2; die "building train_gpt2 failed"; }
    printf '%s\n' "$cmd" >"$run/cflags"
fi
commit=$(git -C "$LLMC_DIR" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] &&
    ! git -C "$LLMC_DIR" diff --quiet HEAD -- train_gpt2.c Makefile llmc 2>/dev/null; then
    commit=$commit+dirty
fi
cc_ver=$(cd "$run" && ${CC:-cc} --version 2>/dev/null | head -1 || echo unknown)
[ "$PREPARE" = 1 ] && { echo "llm.c peer ready: $run"; exit 0; }

# --- the run ------------------------------------------------------------------
export OMP_NUM_THREADS="$THREADS"
if [ "$WAIT" = unset ]; then unset OMP_WAIT_POLICY; else export OMP_WAIT_POLICY="$WAIT"; fi
(cd "$run" && ./train_gpt2) >"$run/run.log" 2>&1 || { cat "$run/run.log" >&2; die "train_gpt2 failed"; }
steps=$(sed -n 's/^step \([0-9]*\): train loss \([0-9.naif-]*\) (took \([0-9.]*\) ms)$/\1 \2 \3/p' "$run/run.log")
[ "$(printf '%s\n' "$steps" | grep -c .)" = "$N" ] ||
    { cat "$run/run.log" >&2; die "expected $N 'step N: train loss' lines from train_gpt2"; }
printf '%s\n' "$steps" | awk -v w="$WARMUP" '{ printf "step %d: %.2f ms, loss %.4f%s\n", $1, $3, $2, $1 < w ? " (warm-up)" : "" }'
first=$(printf '%s\n' "$steps" | awk 'NR == 1 { print $2 }')
lnv=$(awk -v v="$V" 'BEGIN { printf "%.4f", log(v) }')
echo "llm.c's first loss $first, ln V = $lnv (fourfold's own first step on its first batch: ${ff_loss:-?})"
awk -v a="$first" -v b="$lnv" 'BEGIN { d = a - b; exit !(d < 1 && d > -1) }' ||
    die "llm.c's first loss $first is not within 1 of ln V = $lnv: it did not read fourfold's files as meant"
runs=$(printf '%s\n' "$steps" | awk -v w="$WARMUP" '$1 >= w { print $3 }')
med=$(printf '%s\n' "$runs" | sort -n | awk '{ v[NR] = $1 } END { printf "%.2f", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
list=$(printf '%s\n' "$runs" | awk '{ printf "%s%.2f", (NR > 1 ? "," : ""), $1 }')
esc() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
printf '{%s"peer":"llm.c","commit":"%s","L":%d,"C":%d,"NH":%d,"V":%d,"maxT":%d,"B":%d,"T":%d,' \
    "${LABEL:+\"label\":\"$(esc "$LABEL")\",}" "$commit" "$L" "$C" "$NH" "$V" "$maxT" "$B" "$T"
printf '"threads":%d,"omp_wait_policy":"%s","median_ms":%s,"runs_ms":[%s],"warmup":%d,' \
    "$THREADS" "$WAIT" "$med" "$list" "$WARMUP"
printf '"first_loss":%s,"ln_V":%s,"cflags":"%s","cc":"%s"}\n' "$first" "$lnv" "$(esc "$cmd")" "$(esc "$cc_ver")"
