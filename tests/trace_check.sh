#!/bin/sh
# --trace writes one Chrome-trace JSON file with every rank: a process per
# rank, its compute region, and each collective from post to completion on
# its own track.   usage: trace_check.sh FOURFOLD MPIEXEC NP
set -eu
FF=$1 MPIEXEC=$2 NP=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$MPIEXEC" -np "$NP" "$FF" selftest --grid "1x${NP}x1x1" --count 64 --algo ring \
    --trace "$WORK/t.json" > "$WORK/out" 2>&1 || { cat "$WORK/out"; exit 1; }
python3 - "$WORK/t.json" "$NP" <<'PY'
import json, sys
path, np = sys.argv[1], int(sys.argv[2])
events = json.load(open(path))["traceEvents"]
ok = True
def need(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok &= bool(cond)
names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
need(sorted(names) == list(range(np)), f"one process per rank: {sorted(names)}")
need(all("x=" in n for n in names.values()), "processes are labelled with coordinates")
spans = [e for e in events if e.get("ph") == "X"]
need(all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans), f"{len(spans)} intervals, none negative")
for r in range(np):
    mine = [e for e in spans if e["pid"] == r]
    comm = [e for e in mine if e["cat"] == "comm"]
    comp = [e for e in mine if e["cat"] == "compute" and e["name"] == "selftest"]
    need(len(comp) == 1, f"rank {r}: the compute region 'selftest'")
    need(len(comm) >= 8 and all(e["tid"] >= 1 for e in comm),
         f"rank {r}: {len(comm)} collectives on tracks >= 1")
    need(all(comp[0]["ts"] <= e["ts"] <= comp[0]["ts"] + comp[0]["dur"] for e in comm),
         f"rank {r}: collectives fall inside the compute region")
sys.exit(0 if ok else 1)
PY
leftover=$(ls "$WORK" | grep -c tmp || true)
[ "$leftover" = 0 ] || { echo "FAIL temporary files left: $(ls "$WORK")"; exit 1; }
echo "trace: passed"
