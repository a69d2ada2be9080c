#!/bin/sh
# The pruning measurements of docs/samo.md (issue 28).
#
#   bench/samo.sh dp [build-dir]
#     The data-parallel all-reduce of masked training against the dense one
#     on an emulated cluster of 2 nodes x 2 ranks at 1 Gbit/s
#     (bench/cluster.sh, docs/design.md §8): the
#     mini model (L=4 C=128), trained 20 steps and pruned to SPARSITY
#     (default 0.9, global), then STEPS (default 12) steps on 1x1x2x2 (Z
#     inside a node, D across the nodes) from that checkpoint, dense, with
#     its mask and with SAMO, alternately ROUNDS (default 3) times. Prints per variant the
#     median step time and the time rank 0 waited in collectives (steps 3 on,
#     medians over rounds) and their ratios. Needs root (the emulated
#     cluster). About 3 minutes.
#
#   bench/samo.sh memory [build-dir]
#     SAMO's memory and step time against dense and masked training, GPT-2
#     124M (gpt2) trained one step and pruned to 0.5, 0.8 and 0.9 (global),
#     then STEPS (default 4) steps of --batch 4 --seq 64 from it on 1 rank
#     and on 8 (grid 2x1x2x2, oversubscribed): dense, masked at 0.8, SAMO
#     at each sparsity. Prints per run rank 0's model state as the trainer
#     counts it (parameters, gradients, moments, SAMO's offsets), the
#     largest resident set of any rank while steps 3 on ran (sampled from
#     /proc every 0.2 s; the loading of the checkpoint before and the
#     checkpoint written at the end are not counted), the median step time of steps 3 on, and each against the
#     dense run's. About 12 minutes.
#
#   bench/samo.sh quality [build-dir]
#     mini trained STEPS (default 400) steps dense, and the same run pruned
#     iteratively to SPARSITY (default 0.8) in 4 rounds in its first half
#     (--prune-to, --prune-every STEPS/8), on the fortunes corpus, 1 rank:
#     the validation loss at the end of each. About 1 minute.
#
# Raw output goes outside the source tree, to $OUT (default
# ${FF_BENCH_OUT:-/tmp/fourfold-bench}/samo-MODE.jsonl).
set -eu
case ${1:-} in -h | --help | "") sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
MODE=$1
cd "$(dirname "$0")/.."
BUILD=${2:-build}
CLI=$PWD/$BUILD/fourfold
OUT=${OUT:-${FF_BENCH_OUT:-/tmp/fourfold-bench}/samo-$MODE.jsonl}
[ -x "$CLI" ] || { echo "build first: scripts/build.sh $BUILD" >&2; exit 1; }
. scripts/env.sh
mkdir -p "$(dirname "$OUT")"
: > "$OUT.tmp"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
SPARSITY=${SPARSITY:-}

# the median step time and collective wait of a run's steps 3 on
summarise() { # log.jsonl variant round
    python3 - "$@" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if r["type"] == "step"][2:]
vals = [r for r in rows if r["type"] == "val"]
print(json.dumps({"variant": sys.argv[2], "round": int(sys.argv[3]),
                  "ms": statistics.median(r["ms"] for r in steps),
                  "wait_ms": statistics.median(r["wait_ms"] for r in steps),
                  "val_loss": vals[-1]["val_loss"] if vals else None}))
PY
}

case $MODE in
dp)
    CLUSTER=$PWD/bench/cluster.sh
    "$CLUSTER" --check || exit 2
    STEPS=${STEPS:-12}
    ROUNDS=${ROUNDS:-3}
    P=${SPARSITY:-0.9}
    mpirun -np 1 "$CLI" train --model mini --steps 20 --val-every 0 --out "$WORK/base" > "$WORK/out" 2>&1 ||
        { cat "$WORK/out"; exit 1; }
    mpirun -np 1 "$CLI" prune --checkpoint "$WORK/base/model_00000020.bin" --sparsity "$P" \
        --out "$WORK/pruned.bin" | tee "$WORK/prune.out" | head -1
    for r in $(seq "$ROUNDS"); do
        for v in dense masked samo; do
            mask=""
            [ "$v" = masked ] && mask="--mask auto"
            [ "$v" = samo ] && mask="--mask auto --samo"
            "$CLUSTER" -n 2 -m 2 -r 1gbit "$CLI" train --grid 1x1x2x2 --steps "$STEPS" \
                --init-from "$WORK/pruned.bin" $mask --data "$WORK/base/corpus/fortunes_train.bin" \
                --val-every 0 --overwrite --out "$WORK/$v" > "$WORK/out" 2>&1 ||
                { cat "$WORK/out"; exit 1; }
            summarise "$WORK/$v/log.jsonl" "$v" "$r" >> "$OUT.tmp"
        done
    done
    python3 - "$OUT.tmp" "$P" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {v: {k: statistics.median(r[k] for r in rows if r["variant"] == v) for k in ("ms", "wait_ms")}
       for v in ("dense", "masked", "samo")}
print(f"mini pruned to {sys.argv[2]}; 2 nodes x 2 ranks, 1 Gbit/s; grid 1x1x2x2 (D across the "
      "nodes); medians of steps 3 on, then over rounds")
print(f"{'variant':>8} {'step ms':>9} {'wait ms':>9}")
for v, m in med.items():
    print(f"{v:>8} {m['ms']:9.1f} {m['wait_ms']:9.1f}")
for v in ("masked", "samo"):
    print(f"{v} / dense: step {med[v]['ms'] / med['dense']['ms']:.2f}, "
          f"wait {med[v]['wait_ms'] / med['dense']['wait_ms']:.2f}")
PY
    ;;
memory)
    STEPS=${STEPS:-4}
    mpirun -np 1 "$CLI" train --model gpt2 --batch 4 --seq 64 --steps 1 --val-every 0 \
        --out "$WORK/base" > "$WORK/out" 2>&1 || { cat "$WORK/out"; exit 1; }
    for p in 0.5 0.8 0.9; do
        mpirun -np 1 "$CLI" prune --checkpoint "$WORK/base/model_00000001.bin" --sparsity "$p" \
            --out "$WORK/p$p.bin" > "$WORK/out" 2>&1 || { cat "$WORK/out"; exit 1; }
    done
    python3 - "$OUT.tmp" "$CLI" "$WORK" "$STEPS" <<'PY'
import json, os, re, statistics, subprocess, sys, threading, time
out, cli, work, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
data = f"{work}/base/corpus/fortunes_train.bin"
runs = [("dense", None, ""), ("masked", "0.8", ""), ("samo", "0.5", "--samo"),
        ("samo", "0.8", "--samo"), ("samo", "0.9", "--samo")]

def rss_of_ranks(tag):
    total = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if cmd[0].decode() != cli or tag.encode() not in cmd:
                continue
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total.append(int(line.split()[1]) * 1024)
        except (OSError, IndexError, UnicodeDecodeError):
            pass
    return total

rows = []
for ranks, grid in ((1, "1x1x1x1"), (8, "2x1x2x2")):
    for variant, p, extra in runs:
        init = f"{work}/base/model_00000001.bin" if p is None else f"{work}/p{p}.bin"
        mask = "" if p is None else "--mask auto"
        tag = f"{work}/run{ranks}{variant}{p}"
        cmd = (f"mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np {ranks} {cli} train "
               f"--grid {grid} --batch 4 --seq 64 --steps {steps} --val-every 0 --data {data} "
               f"--init-from {init} {mask} {extra} --out {tag}").split()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peak, sampling, ms, state = [0], [False], [], {}
        def sample():
            while proc.poll() is None:
                if sampling[0]:
                    peak[0] = max([peak[0]] + rss_of_ranks(tag))
                time.sleep(0.2)
        th = threading.Thread(target=sample)
        th.start()
        log = []
        for line in proc.stdout:
            log.append(line)
            m = re.match(r"step +(\d+)/\d+ \|.*\| +([\d.]+) ms \|", line)
            if m:
                n = int(m.group(1))
                if n >= 3:
                    ms.append(float(m.group(2)))
                sampling[0] = 2 <= n < steps
            m = re.search(r"params ([\d.]+) grads ([\d.]+) adam ([\d.]+) act", line)
            if m:
                state.update(params=float(m.group(1)), grads=float(m.group(2)),
                             adam=float(m.group(3)))
            m = re.search(r"their offsets ([\d.]+) MiB", line)
            if m:
                state["index"] = float(m.group(1))
        th.join()
        if proc.wait() != 0:
            sys.stdout.write("".join(log))
            sys.exit(1)
        row = {"ranks": ranks, "grid": grid, "variant": variant, "sparsity": p or 0,
               "state_mib": sum(state.values()), "rss_mib": peak[0] / 2**20,
               "ms": statistics.median(ms)}
        rows.append(row)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
print("gpt2 (124M), batch 4 x 64 tokens; state: rank 0's counted parameters, gradients, moments "
      "and offsets; rss: the largest rank's resident set during steps 3 on; medians of steps 3 on")
print(f"{'ranks':>5} {'variant':>7} {'p':>4} {'state MiB':>10} {'x dense':>8} {'rss MiB':>9} "
      f"{'x dense':>8} {'step ms':>9} {'x dense':>8}")
for r in rows:
    d = next(x for x in rows if x["ranks"] == r["ranks"] and x["variant"] == "dense")
    print(f"{r['ranks']:>5} {r['variant']:>7} {r['sparsity']:>4} {r['state_mib']:10.1f} "
          f"{r['state_mib'] / d['state_mib']:8.3f} {r['rss_mib']:9.1f} "
          f"{r['rss_mib'] / d['rss_mib']:8.3f} {r['ms']:9.1f} {r['ms'] / d['ms']:8.3f}")
PY
    ;;
quality)
    STEPS=${STEPS:-400}
    P=${SPARSITY:-0.8}
    EVERY=$((STEPS / 8))
    for v in dense pruned; do
        extra=""
        [ "$v" = pruned ] && extra="--prune-to $P --prune-every $EVERY --prune-steps 4"
        mpirun -np 1 "$CLI" train --model mini --steps "$STEPS" --batch 16 --seq 64 --lr 1e-3 \
            --warmup 20 --val-every 0 --val-batches 16 --seed 7 $extra --out "$WORK/$v" \
            > "$WORK/out" 2>&1 || { cat "$WORK/out"; exit 1; }
        grep "pruning round" "$WORK/out" || true
        summarise "$WORK/$v/log.jsonl" "$v" 1 >> "$OUT.tmp"
    done
    python3 - "$OUT.tmp" "$P" "$STEPS" <<'PY'
import json, sys
rows = {r["variant"]: r for r in map(json.loads, open(sys.argv[1]))}
print(f"mini, {sys.argv[3]} steps on the fortunes, 1 rank; pruned: to {sys.argv[2]} in 4 rounds "
      "in the first half")
for v in ("dense", "pruned"):
    print(f"{v:>7}: validation loss {rows[v]['val_loss']:.4f}")
print(f"pruned / dense: {rows['pruned']['val_loss'] / rows['dense']['val_loss']:.3f}")
PY
    ;;
*) echo "usage: bench/samo.sh dp|memory|quality [build-dir]" >&2; exit 2 ;;
esac
cat "$OUT.tmp" >> "$OUT"
