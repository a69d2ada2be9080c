#!/bin/sh
# The collective benchmarks of docs/coll-bench.md: fourfold's algorithms
# against each other and the MPI library's, on an emulated cluster
# (bench/cluster.sh: network namespaces joined by shaped links,
# docs/design.md §8; run as root) or on this node.
# Raw output (`bench coll --json` lines NAME.rK.jsonl and the printed
# tables *.coll.txt, `bench tune` tables and histories, runs.log with the
# load average around every run) goes OUTSIDE the source tree, to $OUT
# (default ${FF_BENCH_OUT:-/tmp/fourfold-bench}/coll-EXPERIMENT-TIME); at
# the end the script prints the medians and ratios (bench/report.py).
#
#   usage: bench/coll.sh EXPERIMENT [BUILD_DIR]        (BUILD_DIR default: build)
#
#   sweep        every collective and algorithm, AUTO included, timed in the
#                same interleaved iterations, with FF_PROFILE=PROFILES/NAME.json;
#                RUNS runs of each configuration, the run the outer loop
#   tuned        `bench tune` a copy of PROFILES/NAME.json (JOBS jobs, the job
#                the outer loop; with JOBS > 1 each job adds to
#                NAME.history.jsonl and decides on all), then `sweep` with the
#                tuned copies, 4 KiB to MAXB (default 4M: the sizes tuned)
#   profile      `bench profile` on each configuration: NAME.json and
#                NAME.profile.txt (profiles/tb-*.json were made so, OUT=profiles)
#   picks        the algorithm AUTO runs at each size under PROFILES/NAME.json,
#                without the emulated cluster (nodes pretended, one iteration):
#                NAME.picks.jsonl, which `bench/report.py coll-table` prices
#                at the times of measured runs
#   pooled       the picks of each profile directory of SETS ("LABEL=DIR ...";
#                model=- is the shipped profiles without their picks) priced on
#                the runs of every sweep directory in EVAL ("DIR ...")
#   a2a-window   all-to-all, FF_A2A_WINDOW=1 (one partner at a time) against 8,
#                alternating within each run: NAME.wW.rK.jsonl
#   wire-place   in place and out of place (the same run), fp32 and bf16 wire
#                (alternating runs; default RUNS=2, CONFIGS tb-2x2-1gbit-d0us)
#   one-node-ar  all-reduces on this machine alone, the built-in model: 2 ranks
#                4 KiB-64 MiB, 4 and 8 ranks (oversubscribed) 8 B-256 KiB: npN.jsonl
#   context      on one configuration CONFIG, ROUNDS rounds of each set in SETS
#                (an --algos list, "all", or "tune" for `bench tune`): does what
#                is timed alongside change how RATIO="A B" compare?
#   train-ab     `fourfold train --model mini`, grid 1x4x1x1, on CONFIG (default
#                the 2x2 without delay), FF_STRICT_VOLUME=1 against 0,
#                interleaved, RUNS runs each; FF_PROFILE=PROFILE if set
#
# environment (default):
#   CONFIGS   configurations tb-NxM-RATE-dDus: N nodes x M ranks, link RATE,
#             D us one-way delay (tb-2x2-1gbit-d0us tb-2x2-1gbit-d100us
#             tb-4x1-1gbit-d0us tb-4x1-1gbit-d100us)
#   PROFILES  directory of the profiles NAME.json (profiles)
#   RUNS (3)  COLLS (every collective)  ALGOS (every algorithm and auto)
#   MAXB (64M)  ITERS (15, after one warm-up)  MPI_ENV ("VAR=value ..." for
#   every rank, e.g. FF_STRICT_VOLUME=0)  JOBS (1)  TUNE_ARGS (bench tune's
#   defaults)  CONFIG (tb-4x1-1gbit-d100us)  ROUNDS (3)  SETS  RATIO ("rec direct")
#   TB_PREFIX, TB_SUBNET (ffcoll, 10.79.0): bench/cluster.sh's -p and -s, an
#             emulated cluster of its own, apart from other sessions'
#
# e.g. (as root)
#                 bench/coll.sh sweep
#                 JOBS=5 TUNE_ARGS="--repeats 1" bench/coll.sh tuned
#                 COLLS=ar MAXB=4M bench/coll.sh sweep
set -u
cd "$(dirname "$0")/.." || exit 1
EXP=${1:-}
BUILD=${2:-build}
case $EXP in
sweep | tuned | profile | picks | pooled | a2a-window | wire-place | one-node-ar | context | train-ab) ;;
-h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
*) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
FF=$PWD/$BUILD/fourfold
[ -x "$FF" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
CLUSTER=$PWD/bench/cluster.sh
case $EXP in
picks | pooled | one-node-ar) ;;
*) "$CLUSTER" -p "${TB_PREFIX:-ffcoll}" -s "${TB_SUBNET:-10.79.0}" -d 100 --check || exit 2 ;;
esac
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/coll-$EXP-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEFAULT_CONFIGS="tb-2x2-1gbit-d0us tb-2x2-1gbit-d100us tb-4x1-1gbit-d0us tb-4x1-1gbit-d100us"
[ "$EXP" = wire-place ] && DEFAULT_CONFIGS=tb-2x2-1gbit-d0us
CONFIGS=${CONFIGS:-$DEFAULT_CONFIGS}
PROFILES=$(cd "${PROFILES:-profiles}" && pwd)
DEFAULT_RUNS=3
[ "$EXP" = wire-place ] && DEFAULT_RUNS=2
RUNS=${RUNS:-$DEFAULT_RUNS}
ALGOS=${ALGOS:-mpi-blk,mpi,ring,rec,rec-whole,direct,hier-ring,hier-rec,auto}
ITERS=${ITERS:-15}
REPORT="python3 $PWD/bench/report.py"
XENV=
for v in ${MPI_ENV:-}; do XENV="$XENV -x $v"; done
COLLARG=
[ -n "${COLLS:-}" ] && COLLARG="--colls $COLLS"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

log() { echo "$* $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.log"; }

shape() { # NAME -> n m rate d
    rest=${1#tb-}
    sh_=${rest%%-*} rest=${rest#*-}
    rate=${rest%%-*} d=${rest#*-d}
    d=${d%us} n=${sh_%x*} m=${sh_#*x}
}

tb() { # NAME "MPIRUN-OPTIONS" COMMAND...: COMMAND on the emulated cluster NAME
    shape "$1"
    opts=$2
    shift 2
    # shellcheck disable=SC2086
    "$CLUSTER" -p "${TB_PREFIX:-ffcoll}" -s "${TB_SUBNET:-10.79.0}" -n "$n" -m "$m" -r "$rate" \
        -d "$d" -- --mca btl_tcp_links 2 $XENV $opts "$@"
}

coll() { # NAME STEM "MPIRUN-OPTIONS" bench-coll-arguments...: one run, STEM.jsonl, STEM.coll.txt
    name=$1 stem=$2 copts=$3
    shift 3
    rm -f "$OUT/$stem.jsonl"
    log "$stem"
    tb "$name" "-x FF_PROFILE=$PROF/$name.json $copts" "$FF" bench coll "$@" \
        --json "$OUT/$stem.jsonl" > "$OUT/$stem.coll.txt" 2>&1
    log "   rc $?"
}

sweep() { # every configuration, RUNS runs, the run the outer loop
    for k in $(seq "$RUNS"); do
        for name in $CONFIGS; do
            # shellcheck disable=SC2086
            coll "$name" "$name.r$k" "" --algos "$ALGOS" $COLLARG -b 4K -e "$MAXB" -f 4 -n "$ITERS" \
                -w 1 --max-seconds 8 --place out
        done
    done
    echo "raw output: $OUT"
    $REPORT coll-table "$OUT"/*.r*.jsonl
    $REPORT coll-table --summary "$OUT"/*.r*.jsonl
}

picks() { # PROFILE_DIR PICKS_DIR: NAME.picks.jsonl for every configuration
    mkdir -p "$2"
    for name in $CONFIGS; do
        shape "$name"
        rm -f "$2/$name.picks.jsonl"
        # -n 1 -w 0: only the choice matters here, not the (local) time
        # shellcheck disable=SC2086
        mpirun -np $((n * m)) --oversubscribe --mca mpi_yield_when_idle 1 $XENV \
            -x FF_RANKS_PER_NODE="$m" -x FF_PROFILE="$1/$name.json" \
            "$FF" bench coll --algos auto -b 4K -e "$MAXB" -f 4 -n 1 -w 0 --place out \
            --json "$2/$name.picks.jsonl" > /dev/null || echo "picks of $name failed" >&2
    done
}

PROF=$PROFILES
case $EXP in
sweep)
    MAXB=${MAXB:-64M}
    sweep
    ;;
tuned)
    MAXB=${MAXB:-4M}
    JOBS=${JOBS:-1}
    for j in $(seq "$JOBS"); do
        for name in $CONFIGS; do
            [ -f "$OUT/$name.json" ] || cp "$PROFILES/$name.json" "$OUT/$name.json"
            hist='' tag=
            [ "$JOBS" = 1 ] || hist="--history $OUT/$name.history.jsonl" tag=.j$j
            log "$name tune$tag"
            # shellcheck disable=SC2086
            tb "$name" "" "$FF" bench tune --profile "$OUT/$name.json" -b 4K -e "$MAXB" -f 4 \
                -n "$ITERS" $hist ${TUNE_ARGS:-} > "$OUT/$name.tune$tag.txt" 2>&1
            log "   rc $?"
        done
    done
    PROF=$OUT
    sweep
    ;;
profile)
    for name in $CONFIGS; do
        log "$name profile"
        tb "$name" "" "$FF" bench profile --out "$OUT/$name.json" --name "$name" --max-bytes 1M \
            --iters 5 --cores-per-node 1 > "$OUT/$name.profile.txt" 2>&1
        log "   rc $?"
        grep -i "residual\|alpha" "$OUT/$name.profile.txt" | tail -4
    done
    echo "profiles: $OUT/*.json"
    ;;
picks)
    MAXB=${MAXB:-64M}
    picks "$PROFILES" "$OUT"
    python3 - "$OUT"/*.picks.jsonl <<'PY'
import json, sys
for f in sys.argv[1:]:
    print(f"== {f}: what AUTO runs (collective, bytes per rank, algorithm)")
    for r in map(json.loads, open(f)):
        print(f"  {r['coll']:15} {r['size']:>9} {r['ran']}")
PY
    ;;
pooled)
    MAXB=${MAXB:-4M}
    [ -n "${EVAL:-}" ] || { echo "pooled: EVAL=\"DIR ...\" (sweeps of every algorithm) is required" >&2; exit 2; }
    mkdir -p "$OUT/model-profiles"
    for name in $CONFIGS; do # the model alone: the shipped profiles without picks
        python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); p.pop("picks", None); json.dump(p, open(sys.argv[2], "w"))' \
            "$PROFILES/$name.json" "$OUT/model-profiles/$name.json"
    done
    for v in ${SETS:-model=- shipped=$PROFILES}; do
        label=${v%%=*} dir=${v#*=} shown=${v#*=}
        [ "$label" = model ] && dir=$OUT/model-profiles shown="$PROFILES without picks"
        picks "$(cd "$dir" && pwd)" "$OUT/$label"
        for name in $CONFIGS; do
            echo "== $label ($shown): $name"
            runs=
            for e in $EVAL; do runs="$runs $e/$name.r*.jsonl"; done
            # shellcheck disable=SC2086
            $REPORT coll-table $runs "$OUT/$label/$name.picks.jsonl" | grep "^Pick vs"
        done
    done
    ;;
a2a-window)
    MAXB=${MAXB:-64M}
    for name in $CONFIGS; do
        for k in $(seq "$RUNS"); do
            for w in 1 8; do
                coll "$name" "$name.w$w.r$k" "-x FF_A2A_WINDOW=$w" --colls a2a \
                    --algos mpi-blk,mpi,ring -b 4K -e "$MAXB" -f 4 -n "$ITERS" -w 1 \
                    --max-seconds 8 --place out
            done
        done
    done
    echo "raw output: $OUT"
    $REPORT a2a-window "$OUT"/*.w*.r*.jsonl
    ;;
wire-place)
    MAXB=${MAXB:-64M}
    for k in $(seq "$RUNS"); do
        for name in $CONFIGS; do
            for wire in fp32 bf16; do
                coll "$name" "$name.$wire.r$k" "" --colls ag,rs,ar --algos mpi,ring,hier-ring,auto \
                    --wire $wire -b 4K -e "$MAXB" -f 4 -n "$ITERS" -w 1 --max-seconds 8 --place both
            done
        done
    done
    echo "raw output: $OUT"
    for name in $CONFIGS; do $REPORT wire-place "$OUT/$name".*.r*.jsonl; done
    ;;
one-node-ar)
    rm -f "$OUT"/np2.jsonl "$OUT"/np4.jsonl "$OUT"/np8.jsonl # --json appends
    for run in $(seq "$RUNS"); do
        log "np2 run $run"
        # shellcheck disable=SC2086
        mpirun -np 2 --mca mpi_yield_when_idle 1 $XENV "$FF" bench coll --colls allreduce \
            --algos mpi,ring,rec,rec-whole,auto --place out -b 4K -e 64M -f 4 -n 10 -w 3 \
            --json "$OUT/np2.jsonl" > "$OUT/np2-run$run.txt" 2>&1
        for np in 4 8; do
            log "np$np run $run"
            # shellcheck disable=SC2086
            mpirun -np $np --oversubscribe --mca mpi_yield_when_idle 1 $XENV "$FF" bench coll \
                --colls allreduce --algos mpi,ring,rec,rec-whole,auto --place out \
                -b 8 -e 256K -f 4 -n 40 -w 10 --json "$OUT/np$np.jsonl" > "$OUT/np$np-run$run.txt" 2>&1
        done
    done
    echo "raw output: $OUT"
    $REPORT one-node-ar "$OUT/np2.jsonl" "$OUT/np4.jsonl" "$OUT/np8.jsonl"
    ;;
context)
    CONFIG=${CONFIG:-tb-4x1-1gbit-d100us}
    MAXB=${MAXB:-64K}
    COLLS=${COLLS:-ag,rs}
    for k in $(seq "${ROUNDS:-3}"); do
        i=0
        for set in ${SETS:-all ring,rec,direct,hier-ring,hier-rec tune}; do
            i=$((i + 1))
            case $set in
            tune)
                log "tune r$k"
                tb "$CONFIG" "" "$FF" bench tune --profile "$PROFILES/$CONFIG.json" \
                    --out "$OUT/tune.r$k.json" -b 4K -e "$MAXB" -f 4 -n "$ITERS" --repeats 1 \
                    > "$OUT/tune.r$k.txt" 2>&1
                log "   rc $?"
                ;;
            all) coll "$CONFIG" "all.r$k" "" --colls "$COLLS" --algos "$ALGOS" -b 4K -e "$MAXB" \
                    -f 4 -n "$ITERS" -w 1 --place out ;;
            *)
                [ "$k" = 1 ] && echo "set$i: $set" >> "$OUT/sets.txt"
                coll "$CONFIG" "set$i.r$k" "" --colls "$COLLS" --algos "$set" -b 4K -e "$MAXB" \
                    -f 4 -n "$ITERS" -w 1 --place out
                ;;
            esac
        done
    done
    echo "raw output: $OUT"
    [ -f "$OUT/sets.txt" ] && cat "$OUT/sets.txt"
    # shellcheck disable=SC2086,SC2046
    $REPORT ratio ${RATIO:-rec direct} $(ls "$OUT"/*.r*.jsonl "$OUT"/tune.r*.txt 2>/dev/null)
    ;;
train-ab)
    CONFIG=${CONFIG:-tb-2x2-1gbit-d0us}
    popt=
    [ -n "${PROFILE:-}" ] && popt="-x FF_PROFILE=$(cd "$(dirname "$PROFILE")" && pwd)/$(basename "$PROFILE")"
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    # shellcheck disable=SC2046
    "$FF" tokenize --doc-sep % --val-fraction 0 --out "$WORK/f" \
        $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort) > /dev/null
    : > "$OUT/train-ab.jsonl"
    for k in $(seq "$RUNS"); do
        for sv in 1 0; do
            rm -rf "$WORK/run"
            log "strict_volume $sv run $k"
            tb "$CONFIG" "-x FF_STRICT_VOLUME=$sv $popt" "$FF" train --model mini --grid 1x4x1x1 --batch 16 --seq 64 --steps 30 \
                --data "$WORK/f_train.bin" --val-every 0 --log-every 1000000 --out "$WORK/run" \
                < /dev/null > "$WORK/train.out" 2>&1 || { tail -5 "$WORK/train.out"; exit 1; }
            python3 - "$WORK/run/log.jsonl" "$sv" "$k" >> "$OUT/train-ab.jsonl" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
ms = [r["ms"] for r in rows][3:]
print(json.dumps({"strict_volume": int(sys.argv[2]), "run": int(sys.argv[3]),
                  "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
                  "last_loss": rows[-1].get("loss")}))
PY
        done
    done
    echo "raw output: $OUT"
    python3 - "$OUT/train-ab.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for sv in (1, 0):
    m = [r["median_ms"] for r in rows if r["strict_volume"] == sv]
    print(f"FF_STRICT_VOLUME={sv}: median step {statistics.median(m):.0f} ms over {len(m)} runs "
          f"({', '.join(f'{x:.0f}' for x in m)}); loss after the last step "
          f"{[r['last_loss'] for r in rows if r['strict_volume'] == sv][0]}")
PY
    ;;
esac
