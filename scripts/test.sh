#!/bin/sh
# The test suite: set up this machine (Debian packages), build the release
# build (-Werror, what users run: no test hooks) and the sanitizer build
# (-fsanitize=address,undefined, with the fault-injection hooks), where nvcc
# is installed compile the CUDA backend (docs/cuda.md), and run
# every test under CTest on each: first the release build, then the
# sanitizer build. Arguments go to both CTest runs (e.g. -R gpt). The output
# ends with the sanitizer run's summary; the exit status is non-zero if
# either run failed.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== release build (-Wall -Wextra -Wpedantic -Werror)"
scripts/build.sh build -DCMAKE_BUILD_TYPE=Release -DFF_WERROR=ON -DFF_TEST_HOOKS=OFF
echo "== sanitizer build (-fsanitize=address,undefined, -Werror, test hooks)"
scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DFF_SANITIZE=ON -DFF_WERROR=ON \
    -DFF_TEST_HOOKS=ON
cuda=0
if command -v nvcc >/dev/null 2>&1; then
    # where CUDA is installed, the CUDA backend must compile, warnings as
    # errors (its tests need a GPU: scripts/test_cuda.sh, docs/cuda.md)
    echo "== CUDA build (compile check; -DFF_CUDA=ON)"
    scripts/build.sh build-cuda -DCMAKE_BUILD_TYPE=Release -DFF_WERROR=ON -DFF_CUDA=ON || cuda=$?
fi
echo "== tests on the release build"
release=0
(cd build && ctest --output-on-failure -j 1 "$@") || release=$?
echo "== tests on the sanitizer build"
sanitizer=0
(cd build-asan && ctest --output-on-failure -j 1 "$@") || sanitizer=$?
[ "$release" = 0 ] || echo "test: the release build's run failed (above)"
[ "$cuda" = 0 ] || echo "test: the CUDA build failed to compile (above)"
[ "$release" = 0 ] && [ "$sanitizer" = 0 ] && [ "$cuda" = 0 ]
