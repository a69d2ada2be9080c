#!/usr/bin/env python3
"""Markdown tables from `fourfold bench coll --json` lines (bench/coll_testbed.sh).

    bench/coll_table.py bench/results/coll/tb-2x2-1gbit-d0us.jsonl [...]

Per file and collective: one row per size, the out-of-place median time (ms)
of every algorithm, the algorithm AUTO picked (from its row's "ran") with its
own row's time over the fastest of fourfold's algorithms, and the fastest of
the MPI library's two. Schedules that are the same on this layout (hier-ring
and hier-rec on 2 nodes; hier-X and X with one rank per node) are named, so a
"loss" to a twin reads as what it is: noise between two runs of one schedule.
"""
import json
import sys

ALGOS = ["mpi-blk", "mpi", "ring", "rec", "hier-ring", "hier-rec"]
OURS = ["ring", "rec", "hier-ring", "hier-rec"]


def twins(nodes, per_node):
    """Pairs of algorithms that run the same schedule on this layout."""
    t = set()
    if nodes == 2:
        t.add(frozenset(("hier-ring", "hier-rec")))
    if per_node == 1:
        t.add(frozenset(("hier-ring", "ring")))
        t.add(frozenset(("hier-rec", "rec")))
    if nodes == 1:
        t.add(frozenset(("hier-ring", "ring")))
        t.add(frozenset(("hier-rec", "ring")))
    return t


def fmt(us):
    return "–" if us is None or us < 0 else f"{us / 1000:.3g}"


def size_text(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b} B"


def table(path):
    rows = [json.loads(line) for line in open(path)]
    if not rows:
        return
    r0 = rows[0]
    tw = twins(r0["nodes"], r0["per_node"])
    print(f"\n#### {path.split('/')[-1].replace('.jsonl', '')}: {r0['ranks']} ranks, "
          f"{r0['nodes']} node(s) x {r0['per_node']}\n")
    regrets = []
    for coll in ["allgather", "reduce_scatter", "allreduce", "alltoall"]:
        rs = [r for r in rows if r["coll"] == coll]
        if not rs:
            continue
        algos = [a for a in ALGOS if any(r["algo"] == a for r in rs)]
        print(f"\n{coll} (ms, median of the slowest rank, out of place)\n")
        print("| size/rank | " + " | ".join(algos) + " | AUTO ran | pick / best ours | best MPI / pick |")
        print("|---:|" + "---:|" * len(algos) + "---|---:|---:|")
        for size in sorted({r["size"] for r in rs}):
            at = {r["algo"]: r for r in rs if r["size"] == size}
            t = {a: at[a]["oop_us"] for a in algos if a in at}
            pick = at["auto"]["ran"] if "auto" in at else None
            ours = {a: t[a] for a in OURS if a in t and t[a] > 0}
            best = min(ours, key=ours.get) if ours else None
            mpi = [t[a] for a in ("mpi-blk", "mpi") if a in t and t[a] > 0]
            cells = []
            for a in algos:
                c = fmt(t.get(a))
                if a == pick:
                    c = f"**{c}**"
                cells.append(c)
            ratio = best_mpi = ""
            if pick in ours and best:
                ratio = f"{ours[pick] / ours[best]:.2f}"
                if best != pick:
                    twin = frozenset((best, pick)) in tw
                    ratio += f" ({best}{', twin' if twin else ''})"
                    if not twin:
                        regrets.append(ours[pick] / ours[best])
                else:
                    regrets.append(1.0)
            if pick in ours and mpi:
                best_mpi = f"{min(mpi) / ours[pick]:.2f}"
            print(f"| {size_text(size)} | " + " | ".join(cells) + f" | {pick} | {ratio} | {best_mpi} |")
    if regrets:
        worst = max(regrets)
        over = sum(1 for x in regrets if x > 1.10)
        print(f"\nPick vs fastest different schedule: worst {worst:.2f}, "
              f"{over} of {len(regrets)} cells more than 10% slower.")


for p in sys.argv[1:]:
    table(p)
