#!/usr/bin/env python3
"""The all-to-all one partner at a time against all partners at once.

    bench/a2a_window_table.py bench/results/coll/a2a-window/*.jsonl

Reads NAME.wW.rK.jsonl from `bench coll --colls a2a` runs with
FF_A2A_WINDOW=W (bench/results/coll/a2a-window/run.sh, which alternates
W = 1 and 8 within each repetition), and prints per configuration and size
the median over the runs of: the MPI library's two (from all runs), fourfold's
pairwise exchange with W = 1 and with W = 8, their ratio, and the library's
best over W = 8 (> 1: fourfold faster). Times in ms, the slowest rank's.
"""
import json
import re
import statistics
import sys
from collections import defaultdict

t = defaultdict(list)  # (name, size, column) -> times (us)
for path in sys.argv[1:]:
    m = re.match(r"(.*)\.w(\d+)\.r\d+\.jsonl$", path.split("/")[-1])
    if not m:
        continue
    name, w = m.group(1), int(m.group(2))
    for line in open(path):
        r = json.loads(line)
        col = r["algo"] if r["algo"].startswith("mpi") else f"w{w}"
        if r["oop_us"] > 0:
            t[(name, r["size"], col)].append(r["oop_us"])


def med(k):
    return statistics.median(t[k]) if t.get(k) else None


for name in sorted({k[0] for k in t}):
    print(f"\n#### {name}\n")
    print("| size/rank | mpi-blk | mpi | pairwise, 1 at a time | 8 at a time | 8 / 1 | best MPI / 8 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted({k[1] for k in t if k[0] == name}):
        v = {c: med((name, size, c)) for c in ("mpi-blk", "mpi", "w1", "w8")}
        unit = "MiB" if size >= 1 << 20 else "KiB"
        sz = f"{size / (1 << 20 if unit == 'MiB' else 1 << 10):g} {unit}"
        cells = [f"{v[c] / 1000:.3g}" if v[c] else "–" for c in ("mpi-blk", "mpi", "w1", "w8")]
        ratio = f"{v['w8'] / v['w1']:.2f}" if v["w8"] and v["w1"] else ""
        best = min(x for x in (v["mpi-blk"], v["mpi"]) if x)
        vs = f"{best / v['w8']:.2f}" if v["w8"] else ""
        n = len(t[(name, size, "w8")])
        print(f"| {sz} | " + " | ".join(cells) + f" | {ratio} | {vs} |")
    print(f"\n(medians of {n} runs per window)")
