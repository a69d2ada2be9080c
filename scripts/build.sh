#!/bin/sh
# Configures and builds one build folder.  usage: build.sh DIR [cmake -D...]
set -eu
dir=$1
shift
cmake -S "$(dirname "$0")/.." -B "$dir" "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)" >/dev/null
