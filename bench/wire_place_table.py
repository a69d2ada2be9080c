#!/usr/bin/env python3
"""In place vs out of place, and bf16 vs fp32, from `bench coll --place both`
runs (bench/results/coll/wire-place/run.sh):

    bench/wire_place_table.py bench/results/coll/wire-place/tb-2x2-1gbit-d0us.{fp32,bf16}.r*.jsonl

Per collective, size and algorithm: the out-of-place time (ms, median over
the fp32 runs), in place / out of place (median over the fp32 runs of the
ratio within a run), and bf16 / fp32 out of place (median over run pairs k of
bf16 run k over fp32 run k, which ran one after the other).
"""
import json
import re
import statistics
import sys
from collections import defaultdict

runs = defaultdict(dict)  # wire -> k -> rows
for p in sys.argv[1:]:
    m = re.search(r"\.(fp32|bf16)\.r(\d+)\.jsonl$", p)
    if not m:
        sys.exit(f"{p}: expected NAME.(fp32|bf16).rK.jsonl")
    runs[m.group(1)][int(m.group(2))] = [json.loads(line) for line in open(p)]


def index(rows):
    return {(r["coll"], r["size"], r["algo"]): r for r in rows}


fp = {k: index(v) for k, v in runs["fp32"].items()}
bf = {k: index(v) for k, v in runs["bf16"].items()}
keys = sorted({key for d in fp.values() for key in d},
              key=lambda t: (["allgather", "reduce_scatter", "allreduce"].index(t[0]), t[1], t[2]))
algos = []
for key in keys:
    if key[2] not in algos:
        algos.append(key[2])


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


for coll in ["allgather", "reduce_scatter", "allreduce"]:
    sizes = sorted({k[1] for k in keys if k[0] == coll})
    if not sizes:
        continue
    print(f"\n{coll}: out of place ms (fp32) / in place ÷ out / bf16 ÷ fp32\n")
    print("| size | " + " | ".join(algos) + " |")
    print("|---:|" + "---|" * len(algos))
    for s in sizes:
        cells = []
        for a in algos:
            oop = med([d[(coll, s, a)]["oop_us"] for d in fp.values() if (coll, s, a) in d])
            ip = med([d[(coll, s, a)]["ip_us"] / d[(coll, s, a)]["oop_us"]
                      for d in fp.values()
                      if (coll, s, a) in d and d[(coll, s, a)]["ip_us"] > 0])
            wb = med([bf[k][(coll, s, a)]["oop_us"] / fp[k][(coll, s, a)]["oop_us"]
                      for k in fp if k in bf and (coll, s, a) in bf[k] and (coll, s, a) in fp[k]])
            cells.append(f"{fmt(oop and oop / 1000, '.3g')} / {fmt(ip, '.2f')} / {fmt(wb, '.2f')}")
        size = f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
        print(f"| {size} | " + " | ".join(cells) + " |")
wrong = sum(r["oop_wrong"] + max(r["ip_wrong"], 0) for w in runs.values() for rows in w.values()
            for r in rows)
print(f"\n#wrong over all runs: {wrong}")
