# The shared check of the failure tests (bad_input.sh, train_fail.sh): runs
# fourfold under mpirun with each rank inside a shell that records its own
# exit status, so the test sees every rank's status, not only the first one
# mpirun reports. Expects FF, MPIEXEC, NP, WORK and failures to be set.
#   case_ EXPECTED-SUBSTRING EXPECTED-EXIT ARGS...
# passes when there is exactly one "fourfold: error:" line, it contains the
# substring, and every rank exited with the code within 60 s.
case_() { # expected-substring expected-exit args...
    want=$1 code=$2
    shift 2
    rm -f "$WORK"/rc.* "$WORK"/out
    start=$(date +%s.%N)
    timeout "${CASE_TIMEOUT:-60}" "$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 \
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
    if [ "$status" = 124 ]; then verdict="HUNG (killed after ${CASE_TIMEOUT:-60} s)"
    elif [ "$n_msg" != 1 ]; then verdict="FAILED: $n_msg error lines, want 1"
    elif ! echo "$msg" | grep -qF -- "$want"; then verdict="FAILED: message lacks '$want'"
    elif [ "$n_rc" != "$NP" ]; then verdict="FAILED: only $n_rc of $NP ranks exited"
    elif [ "$n_bad" != 0 ]; then verdict="FAILED: $n_bad ranks did not exit with $code"
    fi
    printf '%-44s exit %s on %s/%s ranks, %5.2f s: %s\n      %s\n' "$*" "$code" \
        $((n_rc - n_bad)) "$NP" "$secs" "$verdict" "$msg"
    [ "$verdict" = ok ] || { failures=$((failures + 1)); cat "$WORK/out"; }
}

