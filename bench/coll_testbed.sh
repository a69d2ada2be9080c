#!/bin/sh
# The collective-algorithm measurements of docs/coll-bench.md, on the
# emulated cluster (../shared/tools/testbed): for each shape (4 nodes x 1
# rank, 2 nodes x 2 ranks) and one-way delay (0, 100 us), 1 Gbit/s links:
#   1. `fourfold bench profile` fits alpha/beta per level -> OUT/NAME.json
#   2. `fourfold bench coll` with FF_PROFILE=that file (the selector's model)
#      over 4 KiB .. 64 MiB per rank -> OUT/NAME.coll.txt and .jsonl
# The machine's load average is logged before and after every run (the VM
# is shared; see the doc). Needs root for the network namespaces.
#
# With REPEAT=R (default 1) step 2 runs R times (NAME.rK.coll.txt and
# .rK.jsonl), and bench/coll_table.py takes the median over the runs;
# REPEAT=0 only fits the profiles (how profiles/tb-*.json were made).
#
#   usage: bench/coll_testbed.sh BUILD_DIR OUT_DIR [SHAPES] [DELAYS] [MAXBYTES]
#   e.g.   REPEAT=2 bench/coll_testbed.sh build-coll-rel bench/results/coll "4x1 2x2" "0 100" 64M
set -eu
BUILD=$(cd "$1" && pwd)
OUT=$2
SHAPES=${3:-"4x1 2x2"}
DELAYS=${4:-"0 100"}
MAXB=${5:-64M}
HERE=$(cd "$(dirname "$0")" && pwd)
TB=$HERE/../../shared/tools/testbed/tbcluster.sh
FF=$BUILD/fourfold
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/runs.log
# one TCP connection per pair carries both directions at about half the link
# (testbed README): two, as a real NIC would, so exchange-based algorithms
# (recursive doubling, MPI's) are not penalised by the emulation
LINKS="--mca btl_tcp_links 2"
# a testbed of its own, so that another session's (default prefix "tb") and
# this one never tear each other's down
NET="-p ${COLL_TB_PREFIX:-ffcoll} -s ${COLL_TB_SUBNET:-10.79.0}"

# percent of the machine's CPU time that was busy over 2 seconds
busy() {
    set -- $(head -1 /proc/stat); shift; t1=0; for x; do t1=$((t1 + x)); done; i1=$(($4 + $5))
    sleep 2
    set -- $(head -1 /proc/stat); shift; t2=0; for x; do t2=$((t2 + x)); done; i2=$(($4 + $5))
    echo $((100 - 100 * (i2 - i1) / (t2 - t1)))
}
# waits (up to 3 minutes) until the other sessions leave the CPUs idle
wait_idle() {
    k=0
    while [ $k -lt 90 ]; do
        b=$(busy)
        if [ "$b" -lt 20 ]; then echo "idle ($b% busy) after $((2 * k)) s"; return; fi
        k=$((k + 1))
    done
    echo "NOT idle ($b% busy after 180 s), ran anyway"
}

for shape in $SHAPES; do
    n=${shape%x*} m=${shape#*x}
    for d in $DELAYS; do
        name=tb-${n}x${m}-1gbit-d${d}us
        echo "== $name $(date -u +%FT%TZ) before profile: $(wait_idle); load $(cat /proc/loadavg)" >> "$LOG"
        TB_MPIRUN_ARGS="$LINKS" "$TB" $NET -n "$n" -m "$m" -r 1gbit -d "$d" all -- \
            "$FF" bench profile --out "$OUT/$name.json" --name "$name" --max-bytes 1M \
            --iters 5 --cores-per-node 1 > "$OUT/$name.profile.txt" 2>&1
        echo "   load after profile: $(cat /proc/loadavg)" >> "$LOG"
        k=1
        while [ "$k" -le "${REPEAT:-1}" ]; do
            run=$name
            [ "${REPEAT:-1}" -gt 1 ] && run=$name.r$k
            rm -f "$OUT/$run.jsonl"
            echo "   before coll $k: $(wait_idle); load $(cat /proc/loadavg)" >> "$LOG"
            TB_MPIRUN_ARGS="$LINKS -x FF_PROFILE=$OUT/$name.json" "$TB" $NET -n "$n" -m "$m" \
                -r 1gbit -d "$d" all -- "$FF" bench coll -b 4K -e "$MAXB" -f 4 -n 15 -w 1 \
                --max-seconds 8 --place out --json "$OUT/$run.jsonl" > "$OUT/$run.coll.txt" 2>&1
            echo "   load after coll $k: $(cat /proc/loadavg) $(date -u +%FT%TZ)" >> "$LOG"
            k=$((k + 1))
        done
    done
done
