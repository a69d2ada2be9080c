#!/bin/sh
# fourfold train --model unet-tiny through the library's trainer (the model
# interface, include/fourfold/model.h; docs/unet.md, "Training"): on the
# first 12 of Fashion-MNIST's training images (pooled to 8x8; so the 32
# images of the run span epochs 0, 1 and 2, a batch straddling two) and its
# test images, 4 steps of 8 images on 4 ranks, samples in 10 of T = 100
# reverse steps.
#  1. resumed at the checkpoint of step 2 on the same grid, the run's step-4
#     checkpoint file (parameters, AdamW m and v, state; CRC) and its samples
#     PNG are the uninterrupted run's, byte for byte;
#  2. resumed on another grid (2x1x1x2 -> 1x1x2x2), every parameter of step 4
#     is within the derived bound below of the uninterrupted run's;
#  3. `fourfold sample --png --sample-steps 10` on the step-4 checkpoint
#     writes the run's own samples.png, byte for byte, and in 1 step other
#     bytes, and so does `--sampler ddim` (DDIM's images, not DDPM's);
#  4. with the test hooks (FF_TEST_HOOKS=1: the sanitizer build), the images
#     each rank loaded: every position of the run one image on every rank,
#     each full epoch a permutation of the 12 (shuffled: not in file order,
#     epoch 1 not epoch 0's order), and the run resumed on 1x1x2x2 loading
#     the uninterrupted run's images for steps 3 and 4;
#  5. `fourfold eval` of the step-4 checkpoint: the run's validation loss
#     at step 4 to the printed digits; the step records' model FLOP/s; a run
#     without --data names Fashion-MNIST's files and prints GFLOP/s;
#  6. bad input: one message, the same exit code on every rank (cases.sh).
# The sanitizer build (third argument "sanitize") runs the bad-input cases
# that reach the new checkpoint code only (each case is ~10 s there).
#   usage: unet_train.sh FOURFOLD MPIEXEC [sanitize]
set -u
FF=$1 MPIEXEC=$2 NP=4 QUICK=${3:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
. "$(dirname "$0")/cases.sh"
PY=${PYTHON:-/usr/bin/python3}
MNIST=/usr/share/datasets/fashion-mnist
if [ ! -e "$MNIST/train-images-idx3-ubyte.gz" ]; then
    echo "SKIP: Fashion-MNIST is not installed ($MNIST; scripts/setup.sh installs it)"
    exit 77
fi
# the first 12 training images as an IDX file of their own
"$PY" - "$MNIST/train-images-idx3-ubyte.gz" "$WORK/train12.idx" <<'EOF'
import gzip, struct, sys
raw = gzip.open(sys.argv[1]).read()
open(sys.argv[2], "wb").write(struct.pack(">iiii", 0x803, 12, 28, 28) + raw[16:16 + 12 * 784])
EOF
U="--model unet-tiny --batch 8 --steps 4 --save-every 2 --val-every 2 --val-batches 2
   --data $WORK/train12.idx --val-data $MNIST/t10k-images-idx3-ubyte.gz --sample-steps 10"
HOOKS=${FF_TEST_HOOKS:-0}
run() { # out grid [args]
    out=$1 grid=$2
    shift 2
    "$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train $U \
        --grid "$grid" --out "$out" "$@" > "$out.txt" 2>&1 || {
        cat "$out.txt"
        echo "FAILED: the run of $out"
        failures=$((failures + 1))
    }
}

# 1. the uninterrupted run, and the same run stopped after step 2
mkdir -p "$WORK/ia" "$WORK/ic"
export FF_TEST_UNET_IMAGES="$WORK/ia" # (read by test builds only)
run "$WORK/a" 2x1x1x2
unset FF_TEST_UNET_IMAGES
mkdir -p "$WORK/b"
cp "$WORK/a/model_00000002.bin" "$WORK/a/DONE_00000002" "$WORK/b/"
run "$WORK/b" 2x1x1x2 --resume
if cmp -s "$WORK/a/model_00000004.bin" "$WORK/b/model_00000004.bin" &&
    cmp -s "$WORK/a/samples.png" "$WORK/b/samples.png"; then
    echo "ok: resumed at step 2 on 2x1x1x2: step 4's checkpoint and samples are the same bytes"
else
    echo "FAILED: the resumed run's step-4 checkpoint or samples differ"
    failures=$((failures + 1))
fi
# fourfold sample --png on the checkpoint: the run's own samples.png (the
# same grid, seed and images)
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" sample --grid 2x1x1x2 \
    --checkpoint "$WORK/a/model_00000004.bin" --png "$WORK/s.png" --samples 8 --sample-steps 10 \
    > "$WORK/s.txt" 2>&1 &&
    cmp -s "$WORK/s.png" "$WORK/a/samples.png" && echo "ok: sample --png is the run's samples.png" ||
    { cat "$WORK/s.txt"; echo "FAILED: sample --png"; failures=$((failures + 1)); }
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" sample --grid 2x1x1x2 \
    --checkpoint "$WORK/a/model_00000004.bin" --png "$WORK/s1.png" --samples 8 --sample-steps 1 \
    > "$WORK/s.txt" 2>&1 && ! cmp -s "$WORK/s1.png" "$WORK/a/samples.png" &&
    echo "ok: sample --png --sample-steps 1 gives other images" ||
    { cat "$WORK/s.txt"; echo "FAILED: --sample-steps 1 (or not heeded)"; failures=$((failures + 1)); }
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" sample --grid 2x1x1x2 \
    --checkpoint "$WORK/a/model_00000004.bin" --png "$WORK/d.png" --samples 8 --sample-steps 10 \
    --sampler ddim > "$WORK/s.txt" 2>&1 && grep -q "8 DDIM samples" "$WORK/s.txt" &&
    [ -s "$WORK/d.png" ] && ! cmp -s "$WORK/d.png" "$WORK/a/samples.png" &&
    echo "ok: sample --png --sampler ddim gives other images than DDPM's" ||
    { cat "$WORK/s.txt"; echo "FAILED: --sampler ddim (or not heeded)"; failures=$((failures + 1)); }
grep -q '"type":"val"' "$WORK/a/log.jsonl" && [ -s "$WORK/a/loss.svg" ] ||
    { echo "FAILED: no validation in log.jsonl, or no loss.svg"; failures=$((failures + 1)); }
# the step reports the model's FLOP/s (ff_plan_unet_flops: plan_unet checks
# the count by hand)
grep -q '"type":"step".*"model_flops_per_s":[1-9]' "$WORK/a/log.jsonl" ||
    { echo "FAILED: no model FLOP/s in the step records"; failures=$((failures + 1)); }
# fourfold eval of the step-4 checkpoint on the run's grid: the run's last
# validation loss (the same test images, batches, draws and grid; forward
# only), to all the printed digits
want=$(sed -n 's/.*"type":"val","step":4,"val_loss":\([^}]*\)}.*/\1/p' "$WORK/a/log.jsonl")
"$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" eval --grid 2x1x1x2 \
    --checkpoint "$WORK/a/model_00000004.bin" --batches 2 > "$WORK/e.txt" 2>&1 &&
    [ -n "$want" ] && grep -q "^loss $want (" "$WORK/e.txt" &&
    echo "ok: eval of the step-4 checkpoint: the run's validation loss $want" ||
    { cat "$WORK/e.txt"; echo "FAILED: eval gave another loss than the run's $want"; failures=$((failures + 1)); }

# without --data: Fashion-MNIST's files, named (ff_trainer_get_info), and
# the step line's model FLOP/s as a fraction of the products' rate
if [ "$QUICK" != sanitize ]; then
    "$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" train --model unet-tiny \
        --batch 8 --steps 1 --val-every 0 --val-batches 1 --grid 1x1x2x2 --sample-steps 1 \
        --out "$WORK/def" > "$WORK/def.txt" 2>&1 &&
        grep -q "^data  *$MNIST/train-images-idx3-ubyte.gz, validation $MNIST/t10k-images-idx3-ubyte.gz" \
            "$WORK/def.txt" && grep -q "GFLOP/s.*% of sgemm" "$WORK/def.txt" &&
        echo "ok: the default data named (validation on the test images); the step's GFLOP/s" ||
        { cat "$WORK/def.txt"; echo "FAILED: the default data's names or the step's GFLOP/s"; failures=$((failures + 1)); }
fi

# 2. resumed on 1x1x2x2. Both runs start step 3 from the same canonical
# parameters and moments (step 2's file). One AdamW step moves a parameter p
# by lr_t (|m^_t| / (sqrt(v^_t) + eps) + wd |p|), and by Cauchy-Schwarz over
# the gradients' weights in m and v, |m^_t| / sqrt(v^_t) <= R_t =
# (1-b1) / sqrt(1-b2) * sqrt(sum_{k<t} (b1^2/b2)^k) * sqrt(1-b2^t) / (1-b1^t)
# whatever the gradients (clipping included). So the two runs' step-4
# parameters differ by at most 2 sum_{t=3,4} lr_t (R_t + wd (|p| + 2 lr_t
# R_t))), a bound the rounding of another grid's sums stays far inside but
# a parameter scattered to the wrong place (O(0.1)) does not.
mkdir -p "$WORK/c"
cp "$WORK/a/model_00000002.bin" "$WORK/a/DONE_00000002" "$WORK/c/"
export FF_TEST_UNET_IMAGES="$WORK/ic"
run "$WORK/c" 1x1x2x2 --resume
unset FF_TEST_UNET_IMAGES
"$PY" - "$WORK/a/model_00000004.bin" "$WORK/c/model_00000004.bin" "$WORK/a/log.jsonl" <<'EOF' ||
import json, math, struct, sys
import numpy as np
a, c = (np.fromfile(p, dtype=np.float32) for p in sys.argv[1:3])
h = a[:256].view(np.int32)
n = int(h[52]) | int(h[53]) << 32
pa, pc = a[256:256 + n].astype(np.float64), c[256:256 + n].astype(np.float64)
b1, b2, wd = 0.9, 0.95, 0.1
lrs = {r["step"]: r["lr"] for r in map(json.loads, open(sys.argv[3])) if r["type"] == "step"}
bound = np.zeros(n)
for t in (3, 4):
    s = sum((b1 * b1 / b2) ** k for k in range(t))
    R = (1 - b1) / math.sqrt(1 - b2) * math.sqrt(s) * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    bound += 2 * lrs[t] * (R + wd * (np.abs(pa) + 2 * lrs[t] * R))
d = np.abs(pa - pc)
print("ok: resumed at step 2 on 1x1x2x2: max |dp| %.3g, bound %.3g..%.3g, identical %d of %d"
      % (d.max(), bound.min(), bound.max(), int((d == 0).sum()), n))
sys.exit(0 if (d <= bound).all() else 1)
EOF
    { echo "FAILED: the run resumed on 1x1x2x2 is outside the bound"; failures=$((failures + 1)); }

# 4. the images loaded (test builds)
if [ "$HOOKS" = 1 ]; then
    "$PY" - "$WORK/ia" "$WORK/ic" <<'EOF' ||
import glob, sys
def images(d):
    at = {}
    for path in glob.glob(d + "/images.*"):
        for line in open(path):
            p, img = map(int, line.split())
            if at.setdefault(p, img) != img:
                sys.exit(f"position {p}: images {at[p]} and {img} on different ranks ({d})")
    return at
a, c = images(sys.argv[1]), images(sys.argv[2])
if sorted(a) != list(range(32)) or sorted(c) != list(range(16, 32)):
    sys.exit(f"positions loaded: {sorted(a)}; resumed {sorted(c)}")
epochs = [[a[p] for p in range(e * 12, e * 12 + 12)] for e in (0, 1)]
for e, order in enumerate(epochs):
    if sorted(order) != list(range(12)):
        sys.exit(f"epoch {e} is not a permutation of the 12 images: {order}")
if epochs[0] == list(range(12)) or epochs[0] == epochs[1]:
    sys.exit(f"not shuffled: epoch 0 {epochs[0]}, epoch 1 {epochs[1]}")
if len(set(a[p] for p in range(24, 32))) != 8:
    sys.exit("epoch 2's first 8 images repeat")
if any(c[p] != a[p] for p in c):
    sys.exit("the run resumed on 1x1x2x2 loaded other images for steps 3 and 4")
print(f"ok: images by position on every rank alike; epoch 0 {epochs[0]}, epoch 1 {epochs[1]}; "
      "the resumed run's steps 3 and 4 the same")
EOF
        { echo "FAILED: the images loaded"; failures=$((failures + 1)); }
else
    echo "(the images each rank loads: test builds only, FF_TEST_HOOKS=1)"
fi

# 5. bad input
S="--model unet-tiny --batch 8 --steps 1 --val-every 0 --grid 1x1x2x2"
if [ "$QUICK" != sanitize ]; then
    case_ "fp32 only"                  1 train $S --precision bf16-mixed --out "$WORK/o1"
    case_ "cannot open"                1 train $S --data "$WORK/missing.gz" --out "$WORK/o2"
    printf 'not an idx file' > "$WORK/bad.idx"
    case_ "bad.idx"                    1 train $S --data "$WORK/bad.idx" --out "$WORK/o3"
    case_ "the U-Net presets are"      2 train $S --model unet-huge --out "$WORK/o4"
    case_ "do not apply"               2 train $S --layers 2 --out "$WORK/o5"
    case_ "--sample-steps"             2 train $S --sample-steps 0 --out "$WORK/o6"
    case_ "T = 100 timesteps, so 1 .. 100" 2 train $S --sample-steps 101 --out "$WORK/o7"
    case_ "T = 100 timesteps, so 1 .. 100" 1 sample --grid 1x1x2x2 --checkpoint \
        "$WORK/a/model_00000004.bin" --png "$WORK/p.png" --sample-steps 101
    case_ "bad.idx"                    1 eval --grid 1x1x2x2 --checkpoint "$WORK/a/model_00000004.bin" --data "$WORK/bad.idx"
    case_ "a batch of 6 images over Gz*Gd = 4" 1 eval --grid 1x1x2x2 --checkpoint "$WORK/a/model_00000004.bin" --batch 6
    case_ "--sampler fast: ddpm or ddim" 2 sample --grid 1x1x2x2 --checkpoint \
        "$WORK/a/model_00000004.bin" --png "$WORK/p.png" --sampler fast
fi
# a GPT checkpoint (an llm.c model file's header) in a U-Net run's folder
mkdir -p "$WORK/g"
"$PY" -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<256i', 20240326, 3, *[0]*254))" \
    "$WORK/g/model_00000002.bin"
echo 2 > "$WORK/g/DONE_00000002"
case_ "is a GPT checkpoint"            1 train $S --steps 4 --out "$WORK/g" --resume
case_ "--prompt is a GPT's option"     1 eval --grid 1x1x2x2 --checkpoint "$WORK/a/model_00000004.bin" --prompt hi
[ "$QUICK" = sanitize ] ||
    case_ "is a GPT checkpoint"        1 sample --grid 1x1x2x2 --checkpoint "$WORK/g/model_00000002.bin" --png "$WORK/p.png"
# a U-Net checkpoint given to a GPT run
printf 'some words for a small corpus of a GPT run\n%.0s' $(seq 50) > "$WORK/text"
"$FF" tokenize --out "$WORK/d" --val-fraction 0 "$WORK/text" > /dev/null
case_ "is a U-Net checkpoint"          1 train --layers 2 --hidden 64 --heads 4 --seq 16 --batch 4 \
    --steps 4 --val-every 0 --grid 1x1x2x2 --data "$WORK/d_train.bin" --out "$WORK/c" --resume
# a damaged U-Net checkpoint: its CRC, and no older one to fall back to
mkdir -p "$WORK/x"
cp "$WORK/a/model_00000002.bin" "$WORK/a/DONE_00000002" "$WORK/x/"
printf '\377' | dd of="$WORK/x/model_00000002.bin" bs=1 seek=5000 conv=notrunc 2> /dev/null
case_ "fails its checksum"             1 train $S --steps 4 --out "$WORK/x" --resume

[ "$failures" = 0 ] && echo "all passed" || echo "$failures failed"
[ "$failures" = 0 ]
