#!/usr/bin/env python3
"""Short all-reduces on one node (bench/results/coll/one-node-ar/run.sh):

    bench/one_node_ar_table.py bench/results/coll/one-node-ar/np4.jsonl ...

Each file holds the runs of one rank count, appended one after the other.
Per size: the median over runs of each algorithm's time (us), what AUTO ran,
and the medians over runs of the ratios within a run: AUTO over the old
default (what AUTO ran here before rec-whole was allowed by default: the
ring on 2 ranks, rec on 4 and 8, which moves the ring's bytes in fewer
steps), over Open MPI's non-blocking all-reduce, and over the fastest of
fourfold's other algorithms.
"""
import json
import statistics
import sys
from collections import defaultdict

ALGOS = ["mpi", "ring", "rec", "rec-whole"]

for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    runs, seen = [], set()
    for r in rows:  # a run ends when a (size, algo) repeats
        key = (r["size"], r["algo"])
        if key in seen or not runs:
            runs.append({})
            seen = set()
        seen.add(key)
        runs[-1][key] = r
    ranks = rows[0]["ranks"]
    old = "ring" if ranks == 2 else "rec"
    sizes = sorted({r["size"] for r in rows})
    print(f"\n{path}: {ranks} ranks, {len(runs)} runs; old default {old}")
    print("| size/rank | " + " | ".join(ALGOS) + " | AUTO ran | AUTO/old | AUTO/mpi | AUTO/best other |")
    print("|---:|" + "---:|" * len(ALGOS) + "---|---:|---:|---:|")
    for s in sizes:
        t = {a: statistics.median(run[(s, a)]["oop_us"] for run in runs) for a in ALGOS}
        ran = {run[(s, "auto")]["ran"] for run in runs}
        def ratio(f):
            return statistics.median(f(run) for run in runs)
        to_rec = ratio(lambda run: run[(s, "auto")]["oop_us"] / run[(s, old)]["oop_us"])
        to_mpi = ratio(lambda run: run[(s, "auto")]["oop_us"] / run[(s, "mpi")]["oop_us"])
        to_best = ratio(lambda run: run[(s, "auto")]["oop_us"] /
                        min(run[(s, a)]["oop_us"] for a in ALGOS[1:] if a != run[(s, "auto")]["ran"]))
        size = f"{s // 1024} KiB" if s >= 1024 else f"{s} B"
        print(f"| {size} | " + " | ".join(f"{t[a]:.1f}" for a in ALGOS) +
              f" | {'/'.join(sorted(ran))} | {to_rec:.2f} | {to_mpi:.2f} | {to_best:.2f} |")
