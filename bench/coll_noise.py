#!/usr/bin/env python3
"""How finely can `fourfold bench coll` runs rank collective algorithms?

    bench/coll_noise.py DIR DIR [DIR ...]

Each DIR holds sweeps of one or more configurations, NAME.rK.jsonl (from
bench/coll_tuned_sweep.sh, say), every algorithm of fourfold's timed in the
same interleaved iterations. Per configuration (NAME found in every DIR),
two measures of the resolution of "the fastest algorithm", fourfold's
algorithms only, all-to-all left out (it has one):

- twins: schedules that are the same on this layout (coll_table.twins: the
  same messages in the same order) but timed as two algorithms, the
  median over all runs of every DIR of one over the other's. A ratio above
  1.10 is a "10 % loss" between two copies of one schedule.
- cross-validation: for each DIR, the algorithm with the smallest median
  over that DIR's runs (what a tuning on those runs would pick), judged on
  the runs of the other DIRs: its median there over the fastest different
  schedule's median there. That is the best any selection made from one
  DIR's measurements can do on the others.

The spread that pairing removes: one algorithm's time at one size up to
64 KiB, the largest over the smallest over all runs (median over cells).

And two paired measures (each run times every algorithm in the same
interleaved iterations, so the ratio of two in one run is free of the
run's own speed; the median over runs of that ratio):
- twins, paired: as above, over all runs, and within each DIR alone (how
  finely one DIR's runs resolve);
- static choice: per cell, the algorithm whose largest paired ratio to a
  different schedule, over the DIRs, is smallest. Where even that is
  above 1.10, no fixed choice is within 10 % of the fastest in every DIR:
  the ranking itself moved between the DIRs' times.

Prints one block per configuration; asserts nothing (a benchmark's
analysis, not a test).
"""
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coll_table import OURS, twins  # noqa: E402


def load(path):
    """{(coll, size, algo): out-of-place us} of fourfold's algorithms, and the layout."""
    times, layout = {}, None
    for line in open(path):
        r = json.loads(line)
        layout = (r["nodes"], r["per_node"])
        if r["algo"] in OURS and r["coll"] != "alltoall" and r["oop_us"] > 0:
            times[(r["coll"], r["size"], r["algo"])] = r["oop_us"]
    return times, layout


def median_of(runs, key):
    v = [r[key] for r in runs if key in r]
    return statistics.median(v) if v else None


def paired(runs, c, s, a, b):
    """The median over runs of a's time over b's in the same run."""
    v = [r[(c, s, a)] / r[(c, s, b)] for r in runs if (c, s, a) in r and (c, s, b) in r]
    return statistics.median(v) if v else None


def spread(ratios):
    return (f"{len(ratios)} cells, largest {max(ratios):.2f}, "
            f"{sum(x > 1.10 for x in ratios)} above 1.10") if ratios else "none"


def main(dirs):
    if len(dirs) < 2:
        sys.exit(__doc__)
    names = sorted({os.path.basename(p).split(".r")[0]
                    for p in glob.glob(os.path.join(dirs[0], "*.r[0-9]*.jsonl"))})
    for name in names:
        runs, layout = {}, None
        for d in dirs:
            paths = sorted(glob.glob(os.path.join(d, name + ".r[0-9]*.jsonl")))
            if not paths:
                break
            loaded = [load(p) for p in paths]
            runs[d] = [t for t, _ in loaded]
            layout = loaded[0][1]
        if len(runs) < len(dirs):
            continue
        tw = twins(*layout)
        pooled = [r for d in dirs for r in runs[d]]
        cells = sorted({(c, s) for r in pooled for (c, s, _) in r})
        print(f"{name}: {layout[0]} node(s) x {layout[1]}, {len(pooled)} runs in {len(dirs)} sets")
        ratios = []
        for c, s in cells:
            for a, b in (sorted(p) for p in tw):
                x, y = median_of(pooled, (c, s, a)), median_of(pooled, (c, s, b))
                if x and y:
                    ratios.append(max(x, y) / min(x, y))
        if ratios:
            print(f"  twins, median of all runs: {len(ratios)} cells, median ratio "
                  f"{statistics.median(ratios):.2f}, largest {max(ratios):.2f}, "
                  f"{sum(x > 1.10 for x in ratios)} above 1.10")
        for d in dirs:
            train = runs[d]
            test = [r for e in dirs if e != d for r in runs[e]]
            losses, n = [], 0
            for c, s in cells:
                med_a = {a: median_of(train, (c, s, a)) for a in OURS}
                med_b = {a: median_of(test, (c, s, a)) for a in OURS}
                algos = [a for a in OURS if med_a[a] and med_b[a]]
                if len(algos) < 2:
                    continue
                pick = min(algos, key=med_a.get)
                rivals = [a for a in algos if frozenset((a, pick)) not in tw]
                best = min(rivals, key=med_b.get)
                n += 1
                if med_b[pick] / med_b[best] > 1.10:
                    losses.append(f"{c} {s} {pick} {med_b[pick] / med_b[best]:.2f}x {best}")
            print(f"  chosen on {d} ({len(train)} runs), judged on the other {len(test)}: "
                  f"{len(losses)} of {n} cells more than 10% slower"
                  + ("" if not losses else ": " + "; ".join(losses)))
        small = [max(r[k] for r in pooled) / min(r[k] for r in pooled)
                 for k in set.intersection(*(set(r) for r in pooled)) if k[1] <= 65536]
        if small:
            print(f"  one algorithm at one size up to 64 KiB over all runs, largest over smallest: "
                  f"median {statistics.median(small):.2f} over {len(small)} cells")
        both = [sorted(p) for p in tw]
        for label, sets in [("all runs", [pooled])] + [(d, [runs[d]]) for d in dirs]:
            ratios = []
            for r in sets:
                for c, s in cells:
                    for a, b in both:
                        x = paired(r, c, s, a, b)
                        if x:
                            ratios.append(max(x, 1 / x))
            print(f"  twins, paired, {label}: {spread(ratios)}")
        moved, n = [], 0
        for c, s in cells:
            algos = [a for a in OURS if all((c, s, a) in r for r in pooled)]
            if len(algos) < 2:
                continue

            def worst(a):
                return max(paired(runs[d], c, s, a, b) for d in dirs for b in algos
                           if b != a and frozenset((a, b)) not in tw)
            best = min(algos, key=worst)
            n += 1
            if worst(best) > 1.10:
                moved.append(f"{c} {s} {best} {worst(best):.2f}x")
        print(f"  static choice, paired: {len(moved)} of {n} cells with none within 10% of the "
              f"fastest in every set" + ("" if not moved else ": " + "; ".join(moved)))


if __name__ == "__main__":
    main(sys.argv[1:])
