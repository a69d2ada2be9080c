#!/bin/sh
# The test suite: set up this machine (Debian packages), build with
# -Werror, build the sanitizer build (-fsanitize=address,undefined), and run
# every test on it under CTest. The output ends with CTest's summary.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== release build (-Wall -Wextra -Wpedantic -Werror)"
scripts/build.sh build -DCMAKE_BUILD_TYPE=Release -DFF_WERROR=ON
echo "== sanitizer build (-fsanitize=address,undefined, -Werror)"
scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DFF_SANITIZE=ON -DFF_WERROR=ON
echo "== tests"
cd build-asan
exec ctest --output-on-failure -j 1 "$@"
