#!/bin/sh
# The main job: set up this machine (Debian packages), build, and train the
# `mini` GPT (0.83 M parameters, byte-level) on the fortune(6) texts on 4
# local ranks, grid 1x1x2x2 (Z and D), then print a sample and write
# runs/fortunes/loss.svg. 3 min 19 s from a fresh clone, build included, on a
# 2-core AMD EPYC VM with AVX-512 (2026-11-28; docs/results.md, "Main job")
# (docs/train.md, "The main job"). Extra arguments replace the default ones
# (FF_RANKS=8 scripts/run.sh selftest --grid 2x2x2x1).
#
# `scripts/run.sh unet [train options]`: the second main job, the U-Net of
# docs/unet.md (`unet-fmnist`, 1.4 M parameters) on Fashion-MNIST (Debian's
# dataset-fashion-mnist, padded to 32x32) through the same trainer, grid
# 1x1x2x2, ending with runs/unet/samples.png (16 DDPM samples in 100 of the
# T = 1000 reverse steps: improved DDPM's respacing), loss.svg and
# log.jsonl; options given after `unet` are added to the defaults (a later
# one wins: `scripts/run.sh unet --steps 20`). Its mpirun line took 13.4 min
# on the 2-core VM under a load average of 17-31 from other sessions
# (2026-11-28 16:24 UTC): 300 steps 724 s, validation loss 0.0729, 0.0558,
# 0.0495 at steps 100, 200, 300; sampling about a minute (docs/unet.md,
# "The main U-Net job").
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
FF_RANKS=${FF_RANKS:-4}
. scripts/env.sh
if [ "${1:-}" = unet ]; then
    shift
    set -- train --model unet-fmnist --grid 1x1x2x2 --batch 16 --steps 300 --lr 2e-3 \
        --warmup 20 --val-every 100 --val-batches 4 --log-every 25 --sample-steps 100 \
        --out runs/unet --overwrite "$@"
elif [ $# -eq 0 ]; then
    set -- train --grid 1x1x2x2 --steps 4000 --lr 4e-3 --warmup 100 --val-every 500 \
        --val-batches 16 --log-every 250 --sample 400 --temperature 0.7 --out runs/fortunes \
        --overwrite
fi
exec mpirun -np "$FF_RANKS" build/fourfold "$@"
