#!/bin/sh
# The main job: set up this machine (Debian packages), build, and train the
# `mini` GPT (0.83 M parameters, byte-level) on the fortune(6) texts on 4
# local ranks, grid 1x1x2x2 (Z and D), then print a sample and write
# runs/fortunes/loss.svg. 3 min 19 s from a fresh clone, build included, on a
# 2-core AMD EPYC VM with AVX-512 (2026-11-28; docs/results.md, "Main job")
# (docs/train.md, "The main job"). Extra arguments replace the default ones
# (FF_RANKS=8 scripts/run.sh selftest --grid 2x2x2x1).
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
FF_RANKS=${FF_RANKS:-4}
. scripts/env.sh
if [ $# -eq 0 ]; then
    set -- train --grid 1x1x2x2 --steps 4000 --lr 4e-3 --warmup 100 --val-every 500 \
        --val-batches 16 --log-every 250 --sample 400 --temperature 0.7 --out runs/fortunes \
        --overwrite
fi
exec mpirun -np "$FF_RANKS" build/fourfold "$@"
