#!/bin/sh
# The main job: set up this machine (Debian packages), build, and train a
# small GPT on the fortune(6) texts on 8 local ranks, grid 2x1x2x2 (X, Z and
# D: docs/train.md says why 8 ranks), then print a sample. About four
# minutes on a 2-core machine. Extra arguments replace the default ones
# (FF_RANKS=8 scripts/run.sh selftest --grid 2x2x2x1).
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
FF_RANKS=${FF_RANKS:-8}
. scripts/env.sh
if [ $# -eq 0 ]; then
    set -- train --grid 2x1x2x2 --steps 1500 --lr 2e-3 --warmup 20 --val-every 250 \
        --log-every 50 --sample 400 --out runs/fortunes --overwrite
fi
exec mpirun -np "$FF_RANKS" build/fourfold "$@"
