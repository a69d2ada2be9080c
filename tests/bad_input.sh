#!/bin/sh
# Every bad grid or option fails fast: one message naming the problem, printed
# once, a non-zero exit on every rank, no hang.
#   usage: bad_input.sh FOURFOLD MPIEXEC NP
# Each rank runs inside a shell that records its own exit status, so the test
# sees every rank's status, not only the first one mpirun reports.
set -u
FF=$1 MPIEXEC=$2 NP=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0

case_() { # expected-substring expected-exit args...
    want=$1 code=$2
    shift 2
    rm -f "$WORK"/rc.* "$WORK"/out
    start=$(date +%s.%N)
    timeout 60 "$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 \
        sh -c '"$@"; echo $? > "'"$WORK"'/rc.$OMPI_COMM_WORLD_RANK"' sh "$FF" "$@" \
        > "$WORK/out" 2>&1
    status=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    n_msg=$(grep -c '^fourfold: error:' "$WORK/out")
    msg=$(grep '^fourfold: error:' "$WORK/out" | head -1)
    n_rc=0 n_bad=0
    for f in "$WORK"/rc.*; do
        [ -e "$f" ] || continue
        n_rc=$((n_rc + 1))
        [ "$(cat "$f")" = "$code" ] || n_bad=$((n_bad + 1))
    done
    verdict=ok
    if [ "$status" = 124 ]; then verdict="HUNG (killed after 60 s)"
    elif [ "$n_msg" != 1 ]; then verdict="FAILED: $n_msg error lines, want 1"
    elif ! echo "$msg" | grep -qF -- "$want"; then verdict="FAILED: message lacks '$want'"
    elif [ "$n_rc" != "$NP" ]; then verdict="FAILED: only $n_rc of $NP ranks exited"
    elif [ "$n_bad" != 0 ]; then verdict="FAILED: $n_bad ranks did not exit with $code"
    fi
    printf '%-44s exit %s on %s/%s ranks, %5.2f s: %s\n      %s\n' "$*" "$code" \
        $((n_rc - n_bad)) "$NP" "$secs" "$verdict" "$msg"
    [ "$verdict" = ok ] || { failures=$((failures + 1)); cat "$WORK/out"; }
}

case_ "needs 8 ranks, but the job has $NP"  1 selftest --grid 2x2x2x1
case_ "size of Y is 0"                        1 selftest --grid 2x0x2x1
case_ "size of Z is -1"                       1 selftest --grid 2x1x-1x2
case_ "has 2 sizes"                           1 selftest --grid 2x2
case_ "malformed"                             1 selftest --grid 2xfoox1x1
case_ "more than four sizes"                  1 selftest --grid 1x1x1x2x2
case_ "does not divide"                       1 selftest --grid hsdp:3
case_ "is empty"                              1 selftest --grid=
case_ "expected wait, poll or thread"         2 selftest --progress sometimes
case_ "unknown option --gird"                 2 selftest --gird 2x2x1x1
case_ "needs a value"                         2 selftest --grid
case_ "unknown command 'selftset'"            2 selftset
case_ "cannot write trace"                    1 selftest --grid data --count 3 --trace /nonexistent/dir/t.json

echo "bad_input: $failures failures"
[ "$failures" = 0 ]
