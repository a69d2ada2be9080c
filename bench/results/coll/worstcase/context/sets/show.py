#!/usr/bin/env python3
"""rec's time over direct's at 16 KiB, per set and round, with the median of
the rounds: show.py DIR (the runs of run.sh: SET.rK.jsonl, SET a-d, K 1-3)"""
import json
import statistics
import sys

d = sys.argv[1]
for coll in ("allgather", "reduce_scatter"):
    for s in "abcd":
        v = []
        for k in (1, 2, 3):
            t = {r["algo"]: r["oop_us"] for r in map(json.loads, open(f"{d}/{s}.r{k}.jsonl"))
                 if r["coll"] == coll and r["size"] == 16384}
            v.append(t["rec"] / t["direct"])
        print(coll, 16384, s, " ".join(f"{x:.2f}" for x in v),
              f" median {statistics.median(v):.2f}")
