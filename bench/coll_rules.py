#!/usr/bin/env python3
"""Two rules for deciding picks from a `bench tune --history` file, priced
on `bench coll` runs.

    bench/coll_rules.py HISTDIR EVALDIR [EVALDIR ...]

HISTDIR holds, per configuration NAME, NAME.history.jsonl (the tune jobs'
times) and NAME.tune.jK.txt (their tables; the model's choice is read from
the last). Each EVALDIR holds runs NAME.rK.jsonl of `bench coll` with every
algorithm timed (bench/coll_tuned_sweep.sh). For the all-ranks layout, at
each size tuned, three choices:

- model: the profile's alpha-beta model alone;
- median: the rule of `bench tune --history` before 2026-11-24 (each
  algorithm's median time over the jobs; the fastest picked where the
  model's choice is more than the margin slower);
- worst: the rule since (each job's times over that job's fastest; the
  model's choice kept where its 90th percentile over the jobs is within
  the margin, else the algorithm with the smallest 90th percentile).

Each choice is priced on the runs of all EVALDIRs against the fastest
different schedule of fourfold's (twins, coll_table.twins, are one
schedule; on these all-ranks layouts they are bench tune's twins too): unpaired, the median of its times over the median of the
rival's (as bench/coll_table.py and docs/coll-bench.md price); paired, the
median over runs of the ratio in each run (the runs time every algorithm
in the same interleaved iterations). Prints the cells more than 10 %
slower, per configuration and rule; asserts nothing (a benchmark's
analysis, not a test).
"""
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coll_noise import load, median_of  # noqa: E402
from coll_noise import paired as paired_ratio  # noqa: E402
from coll_table import OURS, twins  # noqa: E402

MARGIN = 0.1  # bench tune's default


def model_choices(path):
    """{(coll, bytes): the model's choice} from a tune table's all-ranks block."""
    out, block = {}, False
    for line in open(path):
        if line.startswith("# all ranks"):
            block = True
        elif line.startswith("#") and not line.startswith("#collective"):
            block = False
        elif block and line.startswith(" "):
            f = line.split()
            out[(f[0], int(f[1]))] = f[2]
    return out


def jobs_of(path, layout):
    """{(coll, bytes): [{algo: us} per job]}, the all-ranks layout's lines
    of jobs of that shape (a job: its lines' time; bench tune's own files
    have one job per time)."""
    cells = {}
    for line in open(path):
        h = json.loads(line)
        if (h["nodes"], h["per_node"]) == layout and h["job"] == f"{layout[0]}x{layout[1]}":
            jobs = cells.setdefault((h["coll"], h["bytes"]), {})
            jobs.setdefault(h["time"], {})[h["algo"]] = h["us"]
    out = {}
    for k, v in cells.items():  # the jobs that timed every algorithm, as bench tune counts
        algos = set().union(*v.values())
        out[k] = [j for j in v.values() if set(j) == algos]
    return out


def high(v):
    """The 90th percentile by nearest rank, as bench tune's."""
    v = sorted(v)
    return v[(9 * len(v) + 9) // 10 - 1]


def choose(rule, model, jobs, tw):
    algos = list(jobs[0])
    if rule == "model":
        return model
    med = {a: statistics.median(j[a] for j in jobs) for a in algos}
    if rule == "median":
        fastest = min(algos, key=med.get)
        keep = med[model] <= (1 + MARGIN) * med[fastest]
    else:  # of equal worst cases, the smaller median, as bench tune
        worst = {a: high([j[a] / min(j.values()) for j in jobs]) for a in algos}
        fastest = min(algos, key=lambda a: (worst[a], med[a]))
        keep = worst[model] <= 1 + MARGIN
    return model if keep or frozenset((model, fastest)) in tw else fastest


def price(runs, cell, pick, tw, paired):
    c, s = cell
    have = [a for a in OURS if all((c, s, a) in r for r in runs)]
    rivals = [a for a in have if a != pick and frozenset((a, pick)) not in tw]
    if pick not in have or not rivals:
        return None
    if paired:
        return max(paired_ratio(runs, c, s, pick, b) for b in rivals)
    return median_of(runs, (c, s, pick)) / min(median_of(runs, (c, s, b)) for b in rivals)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    hist_dir, eval_dirs = argv[0], argv[1:]
    totals = {}
    for hist in sorted(glob.glob(os.path.join(hist_dir, "*.history.jsonl"))):
        name = os.path.basename(hist)[: -len(".history.jsonl")]
        loaded = [load(p) for d in eval_dirs
                  for p in sorted(glob.glob(os.path.join(d, name + ".r[0-9]*.jsonl")))]
        if not loaded:
            continue
        runs, layout = [t for t, _ in loaded], loaded[0][1]
        tw = twins(*layout)
        tables = glob.glob(os.path.join(hist_dir, name + ".tune.j*.txt"))
        model = model_choices(max(tables, key=lambda t: int(t.rsplit(".j", 1)[1][:-4])))
        jobs = jobs_of(hist, layout)
        print(f"{name}: {len(jobs[next(iter(jobs))])} tune jobs, {len(runs)} runs")
        for rule in ("model", "median", "worst"):
            for paired in (False, True):
                losses, n = [], 0
                for cell in sorted(model):
                    pick = choose(rule, model[cell], jobs[cell], tw)
                    r = price(runs, cell, pick, tw, paired)
                    if r is None:
                        continue
                    n += 1
                    if r > 1.10:
                        losses.append(f"{cell[0]} {cell[1]} {pick} {r:.2f}")
                key = (rule, "paired" if paired else "unpaired")
                a, b = totals.get(key, (0, 0))
                totals[key] = (a + len(losses), b + n)
                print(f"  {rule:6} {key[1]:8} {len(losses)} of {n} more than 10% slower"
                      + ("" if not losses else ": " + "; ".join(losses)))
    print("all configurations:")
    for (rule, how), (bad, n) in totals.items():
        print(f"  {rule:6} {how:8} {bad} of {n}")


if __name__ == "__main__":
    main(sys.argv[1:])
