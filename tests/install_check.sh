#!/bin/sh
# `cmake --install` gives a library another C program can use through
# pkg-config: install into a temporary prefix, compile examples/hello_grid.c
# against it (shared and static), run it on 4 ranks, check its output; then
# compile examples/train_tiny.c the same way and train with it on 4 ranks
# (the loss must fall).
#   usage: install_check.sh BUILD_DIR SOURCE_DIR MPIEXEC [extra compiler flags]
set -eu
BUILD=$1 SRC=$2 MPIEXEC=$3
EXTRA=${4:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$WORK/prefix" > "$WORK/install.log"
ls "$WORK/prefix/include/fourfold/fourfold.h" "$WORK/prefix/bin/fourfold" > /dev/null
PC=$(find "$WORK/prefix" -name fourfold.pc)
export PKG_CONFIG_PATH=$(dirname "$PC")
# a library built without the test hooks (FF_TEST_HOOKS off, what users run)
# has none of the fault-injection names in it
if [ "${FF_TEST_HOOKS:-0}" = 0 ]; then
    LIBDIR=$(pkg-config --variable=libdir fourfold)
    for lib in "$LIBDIR/libfourfold.so" "$LIBDIR/libfourfold.a" "$WORK/prefix/bin/fourfold"; do
        if grep -aq FF_FAULT_ "$lib"; then echo "FAIL: $lib contains a fault hook"; exit 1; fi
    done
    echo "no FF_FAULT_ hook in the installed library and program"
fi
echo "pkg-config --cflags --libs fourfold: $(pkg-config --cflags --libs fourfold)"
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Wextra -Werror $EXTRA "$SRC/examples/hello_grid.c" \
    $(pkg-config --cflags --libs fourfold) -Wl,-rpath,"$(pkg-config --variable=libdir fourfold)" \
    -o "$WORK/hello_shared"
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Wextra -Werror $EXTRA "$SRC/examples/hello_grid.c" \
    $(pkg-config --cflags fourfold) "$(pkg-config --variable=libdir fourfold)/libfourfold.a" \
    $(pkg-config --libs --static fourfold | sed 's/-lfourfold//') -o "$WORK/hello_static"
for exe in hello_shared hello_static; do
    "$MPIEXEC" -np 4 "$WORK/$exe" 2x2x1x1 | sort > "$WORK/out"
    cat "$WORK/out"
    # Y groups of 2x2x1x1: {0,2} and {1,3}, so the sums are 2 and 4
    [ "$(grep -c 'sum of ranks in my Y group = 2$' "$WORK/out")" = 2 ] &&
        [ "$(grep -c 'sum of ranks in my Y group = 4$' "$WORK/out")" = 2 ] ||
        { echo "FAIL: $exe printed wrong sums"; exit 1; }
done
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Wextra -Werror $EXTRA "$SRC/examples/train_tiny.c" \
    $(pkg-config --cflags --libs fourfold) -Wl,-rpath,"$(pkg-config --variable=libdir fourfold)" \
    -o "$WORK/train_tiny"
(cd "$WORK" && "$MPIEXEC" -np 4 ./train_tiny 2x1x1x2 40) > "$WORK/train.out"
# the U-Net's example: compiled against the installed headers (not run: its
# sampler takes minutes; docs/unet.md)
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Wextra -Werror $EXTRA "$SRC/examples/train_unet.c" \
    $(pkg-config --cflags --libs fourfold) -lm -o "$WORK/train_unet"
cat "$WORK/train.out"
# the first step's loss is ln 512 (a uniform guess over the tiny vocabulary);
# the last five must average at least 1.5 nats less, and validation must be
# well below the first loss too
python3 - "$WORK/train.out" <<'PY' || { echo "FAIL: train_tiny did not learn"; exit 1; }
import math, re, sys
text = open(sys.argv[1]).read()
loss = [float(m) for m in re.findall(r"^step +\d+ +loss ([0-9.]+)", text, re.M)]
val = [float(m) for m in re.findall(r"^validation loss ([0-9.]+)", text, re.M)]
assert len(loss) == 40 and len(val) == 1, (len(loss), len(val))
assert abs(loss[0] - math.log(512)) < 0.1, loss[0]
last = sum(loss[-5:]) / 5
assert last < loss[0] - 1.5 and val[0] < loss[0] - 1.5, (loss[0], last, val[0])
print(f"train_tiny on 2x1x1x2: loss {loss[0]:.3f} (ln 512 = {math.log(512):.3f}, within 0.1) -> "
      f"{last:.3f} (mean of the last 5), validation {val[0]:.3f}: both at least 1.5 below")
PY
echo "install: passed"
