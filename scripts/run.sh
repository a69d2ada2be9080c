#!/bin/sh
# The main job: set up this machine (Debian packages), build, and run
# fourfold on 8 local ranks.  Extra arguments replace the default ones.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
FF_RANKS=${FF_RANKS:-8}
. scripts/env.sh
if [ $# -eq 0 ]; then
    set -- selftest --grid 2x2x2x1
fi
exec mpirun -np "$FF_RANKS" build/fourfold "$@"
