#!/bin/sh
# The re-execution onto better BLAS kernels (src/blas.c, issue 47), through
# the test hook that fakes the BLAS's answer (FF_TEST_BLAS_CORE; a build
# with FF_TEST_HOOKS, else skipped): with the BLAS "on Prescott" the program
# must run on the kernels the CPU's features call for (from /proc/cpuinfo
# here), say so once, and compute; with the product check failing
# (FF_TEST_BLAS_CHECK=fail) it must go back to the BLAS's own kernels and
# say why. Where OPENBLAS_CORETYPE is set (some machines set it on purpose)
# the program must keep it: this test never sets or unsets it.
#   usage: blas_reexec.sh FOURFOLD MPIEXEC
set -u
FF=$1 MPI=$2
if [ "${FF_TEST_HOOKS:-0}" != 1 ]; then
    echo "blas_reexec: skipped (a build without the test hooks)"
    exit 0
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do case "$flags " in *" $f "*) ;; *) return 1 ;; esac; done; }
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
    want="OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE set in the environment: kept"
    want_fail=$want
elif has avx512f avx512bw avx512dq avx512vl avx2 fma; then
    want="SkylakeX (chosen by fourfold: OpenBLAS fell back to its Prescott kernels"
    want_fail="product check failed"
elif has avx2 fma; then
    want="Haswell (chosen by fourfold: OpenBLAS fell back to its Prescott kernels"
    want_fail="product check failed"
else
    want="OpenBLAS's choice, for a CPU with neither AVX2 nor AVX-512"
    want_fail=$want
fi
fail=0
run() { # what to expect, environment...
    exp=$1
    shift
    out=$(env "$@" "$MPI" -np 2 "$FF" bench gemm --shapes 64 --threads 1 --seconds 0.01 2>&1)
    rc=$?
    heads=$(printf '%s\n' "$out" | grep -c '^# fourfold bench gemm')
    line=$(printf '%s\n' "$out" | grep '^# OpenBLAS kernels' | tr -s ' ')
    echo "$* -> exit $rc, $heads header(s): $line"
    case "$line" in *"$exp"*) ;; *) echo "FAIL: expected '$exp'"; fail=1 ;; esac
    [ "$rc" = 0 ] && [ "$heads" = 1 ] || { echo "FAIL: exit $rc, $heads headers"; fail=1; }
    printf '%s\n' "$out" | grep -q '^ *64x64x64 ' || { echo "FAIL: no product timed"; fail=1; }
}
run "$want" FF_TEST_BLAS_CORE=Prescott
run "$want_fail" FF_TEST_BLAS_CORE=Prescott FF_TEST_BLAS_CHECK=fail
# without the fake: whatever the BLAS chose (any text: only the exit code,
# the one header and the timed product are checked)
run "" FF_TEST_BLAS_UNSET_FAKE=1
[ "$fail" = 0 ] && echo "blas_reexec: passed" || echo "blas_reexec: FAILED"
exit "$fail"
