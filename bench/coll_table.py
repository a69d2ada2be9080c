#!/usr/bin/env python3
"""Markdown tables from `fourfold bench coll --json` lines (bench/coll_testbed.sh).

    bench/coll_table.py bench/results/coll/tb-2x2-1gbit-d0us.jsonl [...]
    bench/coll_table.py bench/results/coll/tb-2x2-1gbit-d0us.r*.jsonl   # repeated runs

Files named NAME.rK.jsonl are runs of one configuration: each time is the
median over the runs (with two runs, their mean), and the summary also gives
each run's own count.

A file named NAME.picks.jsonl (from `bench coll --algos auto` with another
profile, e.g. one re-fitted from the same samples) replaces the algorithms
AUTO ran in NAME's runs: the table then shows what that profile would have
picked, priced at the times measured for those algorithms.

Per file and collective: one row per size, the out-of-place median time (ms)
of every algorithm, the algorithm AUTO picked (from its row's "ran") with its
own row's time over the fastest of fourfold's algorithms, and the fastest of
the MPI library's two. Schedules that are the same on this layout (hier-ring
and hier-rec on 2 nodes; hier-X and X with one rank per node) are named, so a
"loss" to a twin reads as what it is: noise between two runs of one schedule.
"""
import json
import re
import statistics
import sys
from collections import OrderedDict

ALGOS = ["mpi-blk", "mpi", "ring", "rec", "rec-whole", "direct", "hier-ring", "hier-rec"]
OURS = ["ring", "rec", "rec-whole", "direct", "hier-ring", "hier-rec"]


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


def merged(paths):
    """One row per (coll, size, algo): the median over the runs' times."""
    runs = [[json.loads(line) for line in open(p)] for p in paths]
    out = OrderedDict()
    for rows in runs:
        for r in rows:
            key = (r["coll"], r["size"], r["algo"])
            if key not in out:
                out[key] = dict(r, oop_runs=[])
            out[key]["oop_runs"].append(r["oop_us"])
    for r in out.values():
        r["oop_us"] = statistics.median(r["oop_runs"])
    return list(out.values()), runs


def table(name, paths, quiet=False, picks=None):
    rows, runs = merged(paths)
    if not rows:
        return None
    if picks:
        for r in rows:
            if r["algo"] == "auto" and (r["coll"], r["size"]) in picks:
                r["ran"] = picks[(r["coll"], r["size"])]
    r0 = rows[0]
    tw = twins(r0["nodes"], r0["per_node"])
    if not quiet:
        print(f"\n#### {name}: {r0['ranks']} ranks, {r0['nodes']} node(s) x {r0['per_node']}"
              + (f", median of {len(paths)} runs" if len(paths) > 1 else "")
              + (", AUTO's picks from " + picks["file"] if picks else "") + "\n")
    out = print if not quiet else (lambda *a, **k: None)
    regrets, overall, per_run = [], [], []
    for coll in ["allgather", "reduce_scatter", "allreduce", "alltoall"]:
        rs = [r for r in rows if r["coll"] == coll]
        if not rs:
            continue
        algos = [a for a in ALGOS if any(r["algo"] == a for r in rs)]
        out(f"\n{coll} (ms, median of the slowest rank, out of place)\n")
        auto = "AUTO picks" if picks else "AUTO ran"
        out("| size/rank | " + " | ".join(algos) + f" | {auto} | pick / best ours | best MPI / pick |")
        out("|---:|" + "---:|" * len(algos) + "---|---:|---:|")
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
                        if ours[pick] / ours[best] > 1.10:
                            runs_p, runs_b = at[pick]["oop_runs"], at[best]["oop_runs"]
                            per_run.append(min(x / y for x, y in zip(runs_p, runs_b)))
                else:
                    regrets.append(1.0)
            if pick in ours and mpi:
                best_mpi = f"{min(mpi) / ours[pick]:.2f}"
                overall.append(ours[pick] / min(min(mpi), ours[best]))
            out(f"| {size_text(size)} | " + " | ".join(cells) + f" | {pick} | {ratio} | {best_mpi} |")
    summary = None
    if regrets:
        worst = max(regrets)
        over = sum(1 for x in regrets if x > 1.10)
        summary = (worst, over, len(regrets))
        out(f"\nPick vs fastest different schedule of fourfold's: worst {worst:.2f}, "
            f"{over} of {len(regrets)} cells more than 10% slower.")
        if len(paths) > 1 and per_run:
            # a loss that every run shows, or one that the runs disagree on
            out(f"Of those {over}, slower in every run: {sum(1 for x in per_run if x > 1)}; "
                f"more than 10% slower in every run: {sum(1 for x in per_run if x > 1.10)}.")
        if overall:
            out(f"Pick vs fastest of all, the MPI library's included: worst {max(overall):.2f}, "
                f"{sum(1 for x in overall if x > 1.10)} of {len(overall)} cells more than 10% slower.")
        if len(paths) > 1 and not quiet:
            # the noise: one algorithm at one size, run against run
            spread = []
            for r in rows:
                t = [x for x in r["oop_runs"] if x > 0]
                if len(t) > 1 and r["algo"] != "auto":
                    spread.append(max(t) / min(t))
            if spread:
                spread.sort()
                out(f"Run to run, the same algorithm at the same size: median ratio "
                    f"{statistics.median(spread):.2f}, {sum(1 for x in spread if x > 1.10)} of "
                    f"{len(spread)} cells differ by more than 10%, largest {spread[-1]:.2f}.")
            each = [table(name, [p], quiet=True, picks=picks) for p in paths]
            out("Each run alone (pick vs fastest different schedule of fourfold's): " + "; ".join(
                f"run {i + 1}: worst {w:.2f}, {o} of {n} cells > 10%"
                for i, (w, o, n) in enumerate(e for e in each if e)) + ".")
    return summary


def main(argv):
    groups, picked = OrderedDict(), {}
    for p in argv:
        base = p.split("/")[-1]
        if base.endswith(".picks.jsonl"):
            pk = {"file": base}
            for line in open(p):
                r = json.loads(line)
                if r["algo"] == "auto":
                    pk[(r["coll"], r["size"])] = r["ran"]
            picked[base[: -len(".picks.jsonl")]] = pk
            continue
        name = re.sub(r"(\.r\d+)?\.jsonl$", "", base)
        groups.setdefault(name, []).append(p)
    for name, paths in groups.items():
        table(name, paths, picks=picked.get(name))


if __name__ == "__main__":
    main(sys.argv[1:])
