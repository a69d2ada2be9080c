#!/usr/bin/env python3
"""Tables and noise measures from the collective benchmarks' raw output.

    bench/report.py coll-table [--summary] FILE.jsonl ...   per-configuration tables
    bench/report.py noise DIR DIR [DIR ...]                 how finely runs rank algorithms
    bench/report.py rules HISTDIR EVALDIR [EVALDIR ...]     bench tune --history's rules priced
    bench/report.py ratio A B FILE ...                      A's time over B's, per file and cell
    bench/report.py a2a-window FILE.jsonl ...               all-to-all, 1 partner against 8
    bench/report.py one-node-ar FILE.jsonl ...              short all-reduces on one node
    bench/report.py wire-place FILE.jsonl ...               in place / out of place, bf16 / fp32

The inputs are what bench/coll.sh writes (outside the source tree, under
$FF_BENCH_OUT): `fourfold bench coll --json` lines (NAME.rK.jsonl, one file
per run), `bench tune` tables (NAME.tune*.txt) and histories
(NAME.history.jsonl). `bench/report.py SUBCOMMAND --help` says more. The
tool analyses benchmarks; it asserts nothing (not a test). Conclusions and
the figures it printed: docs/coll-bench.md (its per-size tables of the runs of
2026-11-22 to 24: `git show 935cc69:bench/results/coll.md`).
"""
import argparse
import glob
import inspect
import json
import os
import re
import statistics
import sys
from collections import OrderedDict, defaultdict

ALGOS = ["mpi-blk", "mpi", "ring", "rec", "rec-whole", "direct", "hier-ring", "hier-rec"]
OURS = ["ring", "rec", "rec-whole", "direct", "hier-ring", "hier-rec"]
MARGIN = 0.1  # bench tune's default


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


def size_text(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b} B"


def noop(*_a, **_k):
    pass


# ---- coll-table ------------------------------------------------------------

def fmt(us):
    return "–" if us is None or us < 0 else f"{us / 1000:.3g}"


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
    """Prints NAME's tables (quiet: nothing); returns the summary's figures
    (None without a pick): the pick against the fastest different schedule
    of fourfold's (worst, over, n: the worst ratio, the cells more than 10 %
    slower, the cells counted; every: of those, more than 10 % slower in
    every run), against the fastest of all (all_worst, all_over, all_n),
    the run-to-run spread (spread: median, cells above 1.10, cells,
    largest) and each run alone (each: [(worst, over, n)])."""
    rows, _ = merged(paths)
    if not rows:
        return None
    if picks:
        for r in rows:
            if r["algo"] == "auto" and (r["coll"], r["size"]) in picks:
                r["ran"] = picks[(r["coll"], r["size"])]
    r0 = rows[0]
    tw = twins(r0["nodes"], r0["per_node"])
    out = print if not quiet else noop
    out(f"\n#### {name}: {r0['ranks']} ranks, {r0['nodes']} node(s) x {r0['per_node']}"
        + (f", median of {len(paths)} runs" if len(paths) > 1 else "")
        + (", AUTO's picks from " + picks["file"] if picks else "") + "\n")
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
    if not regrets:
        return None
    st = dict(name=name, nodes=r0["nodes"], per_node=r0["per_node"], runs=len(paths),
              worst=max(regrets), over=sum(1 for x in regrets if x > 1.10), n=len(regrets),
              every=None, all_worst=None, spread=None, each=None)
    out(f"\nPick vs fastest different schedule of fourfold's: worst {st['worst']:.2f}, "
        f"{st['over']} of {st['n']} cells more than 10% slower.")
    if len(paths) > 1 and per_run:
        # a loss that every run shows, or one that the runs disagree on
        st["every"] = sum(1 for x in per_run if x > 1.10)
        out(f"Of those {st['over']}, slower in every run: {sum(1 for x in per_run if x > 1)}; "
            f"more than 10% slower in every run: {st['every']}.")
    elif len(paths) > 1:
        st["every"] = 0
    if overall:
        st.update(all_worst=max(overall), all_over=sum(1 for x in overall if x > 1.10),
                  all_n=len(overall))
        out(f"Pick vs fastest of all, the MPI library's included: worst {st['all_worst']:.2f}, "
            f"{st['all_over']} of {st['all_n']} cells more than 10% slower.")
    if len(paths) > 1:
        # the noise: one algorithm at one size, run against run
        spread = []
        for r in rows:
            t = [x for x in r["oop_runs"] if x > 0]
            if len(t) > 1 and r["algo"] != "auto":
                spread.append(max(t) / min(t))
        if spread:
            spread.sort()
            st["spread"] = (statistics.median(spread), sum(1 for x in spread if x > 1.10),
                            len(spread), spread[-1])
            out(f"Run to run, the same algorithm at the same size: median ratio "
                f"{st['spread'][0]:.2f}, {st['spread'][1]} of "
                f"{st['spread'][2]} cells differ by more than 10%, largest {st['spread'][3]:.2f}.")
        if not quiet:
            each = [table(name, [p], quiet=True, picks=picks) for p in paths]
            st["each"] = [(e["worst"], e["over"], e["n"]) for e in each if e]
            out("Each run alone (pick vs fastest different schedule of fourfold's): " + "; ".join(
                f"run {i + 1}: worst {w:.2f}, {o} of {n} cells > 10%"
                for i, (w, o, n) in enumerate(st["each"])) + ".")
    return st


def summary_table(stats):
    """One markdown row per configuration."""
    print("| configuration | runs | AUTO vs fastest other schedule of ours: worst, cells > 10 % "
          "| > 10 % in every run | vs fastest incl. the MPI library's: worst, cells > 10 % "
          "| run to run, one algorithm and size: median, largest | each run alone: worst, cells > 10 % |")
    print("|---|---:|---|---:|---|---|---|")
    for st in stats:
        name = st["name"].replace("tb-", "").replace("-1gbit", "")
        every = "–" if st["every"] is None else str(st["every"])
        vs_all = ("–" if st["all_worst"] is None else
                  f"{st['all_worst']:.2f}, {st['all_over']} of {st['all_n']}")
        spread = "–" if not st["spread"] else f"{st['spread'][0]:.2f}, {st['spread'][3]:.2f}"
        each = "–"
        if st["each"]:
            ws = [w for w, _, _ in st["each"]]
            each = (f"{min(ws):.2f}-{max(ws):.2f}, "
                    + "/".join(str(o) for _, o, _ in st["each"]))
        print(f"| {name} | {st['runs']} | {st['worst']:.2f}, {st['over']} of {st['n']} | {every} "
              f"| {vs_all} | {spread} | {each} |")


def coll_table(args):
    """Markdown tables from `fourfold bench coll --json` lines, one block per
    configuration. Files named NAME.rK.jsonl are runs of one configuration:
    each time is the median over the runs (with two runs, their mean), and
    the summary also gives each run's own count.

    A file named NAME.picks.jsonl (from `bench coll --algos auto` under
    another profile: bench/coll.sh picks) replaces the algorithms AUTO ran in
    NAME's runs: the table then shows what that profile would have picked,
    priced at the times measured for those algorithms.

    Per collective: one row per size, the out-of-place median time (ms) of
    every algorithm, the algorithm AUTO picked (its row's "ran") with its own
    row's time over the fastest of fourfold's algorithms, and the fastest of
    the MPI library's two over it (> 1: the pick is faster). Schedules that
    are the same on this layout (hier-ring and hier-rec on 2 nodes; hier-X
    and X with one rank per node) are named twins: a "loss" to a twin is
    noise between two timings of one schedule, and is not counted."""
    groups, picked = OrderedDict(), {}
    for p in args.files:
        base = os.path.basename(p)
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
    stats = []
    for name, paths in groups.items():
        if args.summary:
            st = table(name, paths, quiet=True, picks=picked.get(name))
            if st:
                st["each"] = [(e["worst"], e["over"], e["n"]) for e in
                              (table(name, [p], quiet=True, picks=picked.get(name)) for p in paths)
                              if e] if len(paths) > 1 else None
                stats.append(st)
        else:
            table(name, paths, picks=picked.get(name))
    if stats:
        summary_table(stats)


# ---- noise -----------------------------------------------------------------

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


def spread_text(ratios):
    return (f"{len(ratios)} cells, largest {max(ratios):.2f}, "
            f"{sum(x > 1.10 for x in ratios)} above 1.10") if ratios else "none"


def noise(args):
    """How finely can `fourfold bench coll` runs rank collective algorithms?

    Each DIR holds sweeps NAME.rK.jsonl (bench/coll.sh sweep or tuned),
    every algorithm of fourfold's timed in the same interleaved iterations.
    Per configuration (NAME found in every DIR), fourfold's algorithms only,
    all-to-all left out (it has one):

    - twins: schedules that are the same on this layout but timed as two
      algorithms, the median over all runs of one over the other's; above
      1.10 is a "10 % loss" between two copies of one schedule;
    - cross-validation: for each DIR, the algorithm with the smallest median
      over its runs (what a tuning on them would pick), judged on the other
      DIRs' runs against the fastest different schedule there;
    - the spread that pairing removes: one algorithm's time at one size up
      to 64 KiB, largest over smallest over all runs (median over cells);
    - twins, paired (the median over runs of the ratio within each run:
      free of the run's own speed), over all runs and within each DIR;
    - static choice, paired: per cell, the algorithm whose largest paired
      ratio to a different schedule over the DIRs is smallest; where even
      that is above 1.10, no fixed choice is within 10 % of the fastest in
      every DIR: the ranking itself moved between the DIRs."""
    dirs = args.dirs
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
            print(f"  twins, paired, {label}: {spread_text(ratios)}")
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


# ---- rules -----------------------------------------------------------------

def tune_rows(path):
    """The rows of a `bench tune` table's all-ranks block, split into fields."""
    block = False
    for line in open(path):
        if line.startswith("# all ranks"):
            block = True
        elif line.startswith("#") and not line.startswith("#collective"):
            block = False
        elif block and line.startswith(" "):
            yield line.split()


def model_choices(path):
    """{(coll, bytes): the model's choice} from a tune table's all-ranks block."""
    return {(f[0], int(f[1])): f[2] for f in tune_rows(path)}


def jobs_of(path, layout):
    """{(coll, bytes): [{algo: us} per job]}, the all-ranks layout's lines
    of jobs of that shape (a job: its lines' time)."""
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


def price(runs, cell, pick, tw, is_paired):
    c, s = cell
    have = [a for a in OURS if all((c, s, a) in r for r in runs)]
    rivals = [a for a in have if a != pick and frozenset((a, pick)) not in tw]
    if pick not in have or not rivals:
        return None
    if is_paired:
        return max(paired(runs, c, s, pick, b) for b in rivals)
    return median_of(runs, (c, s, pick)) / min(median_of(runs, (c, s, b)) for b in rivals)


def rules(args):
    """Three ways to decide picks from `bench tune --history` jobs, priced
    on `bench coll` runs.

    HISTDIR holds, per configuration NAME, NAME.history.jsonl (the tune
    jobs' times) and NAME.tune.jK.txt (their tables; the model's choice is
    read from the last): what `JOBS=N bench/coll.sh tuned` writes. Each
    EVALDIR holds runs NAME.rK.jsonl with every algorithm timed. For the
    all-ranks layout, at each size tuned: model (the profile's alpha-beta
    model alone); median (each algorithm's median over the jobs, the rule
    before 2026-11-24); worst (each job's times over that job's fastest, the
    model's choice kept where its 90th percentile over the jobs is within the
    margin, else the smallest 90th percentile: bench tune's rule). Each is
    priced against the fastest different schedule of fourfold's, unpaired
    (the ratio of the medians) and paired (the median over runs of the ratio
    in each run)."""
    hist_dir, eval_dirs = args.histdir, args.evaldirs
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
            for is_paired in (False, True):
                losses, n = [], 0
                for cell in sorted(model):
                    pick = choose(rule, model[cell], jobs[cell], tw)
                    r = price(runs, cell, pick, tw, is_paired)
                    if r is None:
                        continue
                    n += 1
                    if r > 1.10:
                        losses.append(f"{cell[0]} {cell[1]} {pick} {r:.2f}")
                key = (rule, "paired" if is_paired else "unpaired")
                a, b = totals.get(key, (0, 0))
                totals[key] = (a + len(losses), b + n)
                print(f"  {rule:6} {key[1]:8} {len(losses)} of {n} more than 10% slower"
                      + ("" if not losses else ": " + "; ".join(losses)))
    print("all configurations:")
    for (rule, how), (bad, n) in totals.items():
        print(f"  {rule:6} {how:8} {bad} of {n}")


# ---- ratio -----------------------------------------------------------------

def tune_times(path):
    """{(coll, bytes): {algo: us}} from a `bench tune` table's all-ranks block."""
    out = {}
    for row in tune_rows(path):
        f = [x for x in row if x not in ("->", "pick")]
        out[(f[0], int(f[1]))] = dict(zip(f[8::2], map(float, f[9::2])))
    return out


def ratio(args):
    """A's time over B's in each FILE, per (collective, size), with the
    median over the files: FILEs are runs of `bench coll --json` (*.jsonl)
    or `bench tune` tables (*.txt, their all-ranks block). Files are grouped
    by their name without the run number (SET.rK.jsonl, tune.rK.txt), one
    line per group and cell (bench/coll.sh context)."""
    groups = OrderedDict()
    for p in args.files:
        groups.setdefault(re.sub(r"(\.r\d+)?\.\w+$", "", os.path.basename(p)), []).append(p)
    res = OrderedDict()
    for group, paths in groups.items():
        for p in paths:
            if p.endswith(".txt"):
                t = tune_times(p)
            else:
                t = defaultdict(dict)
                for line in open(p):
                    r = json.loads(line)
                    t[(r["coll"], r["size"])][r["algo"]] = r["oop_us"]
            for cell, algos in t.items():
                if args.a in algos and args.b in algos and algos[args.b] > 0:
                    res.setdefault((cell, group), []).append(algos[args.a] / algos[args.b])
    print(f"{args.a} / {args.b}, per file, and the median")
    for ((coll, size), group), v in sorted(res.items()):
        print(f"{coll:15} {size_text(size):>8}  {group:20} " + " ".join(f"{x:.2f}" for x in v)
              + f"  median {statistics.median(v):.2f}")


# ---- a2a-window ------------------------------------------------------------

def a2a_window(args):
    """The all-to-all one partner at a time against all partners at once,
    from NAME.wW.rK.jsonl (`bench coll --colls a2a` with FF_A2A_WINDOW=W:
    bench/coll.sh a2a-window, which alternates W = 1 and 8 in each run).
    Per configuration and size, medians over the runs: the MPI library's
    two, the pairwise exchange with W = 1 and with W = 8, their ratio, and
    the library's best over W = 8 (> 1: fourfold faster). Times in ms."""
    t = defaultdict(list)  # (name, size, column) -> times (us)
    for path in args.files:
        m = re.match(r"(.*)\.w(\d+)\.r\d+\.jsonl$", os.path.basename(path))
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
        n = 0
        for size in sorted({k[1] for k in t if k[0] == name}):
            v = {c: med((name, size, c)) for c in ("mpi-blk", "mpi", "w1", "w8")}
            cells = [f"{v[c] / 1000:.3g}" if v[c] else "–" for c in ("mpi-blk", "mpi", "w1", "w8")]
            r = f"{v['w8'] / v['w1']:.2f}" if v["w8"] and v["w1"] else ""
            best = min(x for x in (v["mpi-blk"], v["mpi"]) if x)
            vs = f"{best / v['w8']:.2f}" if v["w8"] else ""
            n = len(t[(name, size, "w8")])
            print(f"| {size_text(size)} | " + " | ".join(cells) + f" | {r} | {vs} |")
        print(f"\n(medians of {n} runs per window)")


# ---- one-node-ar -----------------------------------------------------------

def one_node_ar(args):
    """Short all-reduces on one node (bench/coll.sh one-node-ar). Each file
    holds the runs of one rank count, appended one after the other. Per
    size: the median over runs of each algorithm's time (us), what AUTO ran,
    and the medians over runs of the ratios within a run: AUTO over the old
    default (the ring on 2 ranks, rec on 4 and 8: what AUTO ran before
    rec-whole was allowed), over Open MPI's non-blocking all-reduce, and over
    the fastest of fourfold's other algorithms."""
    algos = ["mpi", "ring", "rec", "rec-whole"]
    for path in args.files:
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
        print("| size/rank | " + " | ".join(algos) + " | AUTO ran | AUTO/old | AUTO/mpi | AUTO/best other |")
        print("|---:|" + "---:|" * len(algos) + "---|---:|---:|---:|")
        for s in sizes:
            t = {a: statistics.median(run[(s, a)]["oop_us"] for run in runs) for a in algos}
            ran = {run[(s, "auto")]["ran"] for run in runs}

            def med_ratio(f):
                return statistics.median(f(run) for run in runs)
            to_old = med_ratio(lambda run: run[(s, "auto")]["oop_us"] / run[(s, old)]["oop_us"])
            to_mpi = med_ratio(lambda run: run[(s, "auto")]["oop_us"] / run[(s, "mpi")]["oop_us"])
            to_best = med_ratio(lambda run: run[(s, "auto")]["oop_us"] /
                                min(run[(s, a)]["oop_us"] for a in algos[1:]
                                    if a != run[(s, "auto")]["ran"]))
            size = f"{s // 1024} KiB" if s >= 1024 else f"{s} B"
            print(f"| {size} | " + " | ".join(f"{t[a]:.1f}" for a in algos) +
                  f" | {'/'.join(sorted(ran))} | {to_old:.2f} | {to_mpi:.2f} | {to_best:.2f} |")


# ---- wire-place ------------------------------------------------------------

def wire_place(args):
    """In place against out of place, and bf16 against fp32, from
    NAME.(fp32|bf16).rK.jsonl (`bench coll --place both`: bench/coll.sh
    wire-place). Per collective, size and algorithm: the out-of-place time
    (ms, median over the fp32 runs) / in place over out of place (median
    over the fp32 runs of the ratio within a run) / bf16 over fp32 out of
    place (median over k of bf16 run k over fp32 run k, run one after the
    other)."""
    runs = defaultdict(dict)  # wire -> k -> rows
    for p in args.files:
        m = re.search(r"\.(fp32|bf16)\.r(\d+)\.jsonl$", p)
        if not m:
            sys.exit(f"{p}: expected NAME.(fp32|bf16).rK.jsonl")
        runs[m.group(1)][int(m.group(2))] = [json.loads(line) for line in open(p)]

    def index(rows):
        return {(r["coll"], r["size"], r["algo"]): r for r in rows}

    fp = {k: index(v) for k, v in runs["fp32"].items()}
    bf = {k: index(v) for k, v in runs["bf16"].items()}
    order = ["allgather", "reduce_scatter", "allreduce"]
    keys = sorted({key for d in fp.values() for key in d if key[0] in order},
                  key=lambda t: (order.index(t[0]), t[1], t[2]))
    algos = []
    for key in keys:
        if key[2] not in algos:
            algos.append(key[2])

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def show(x, spec):
        return "–" if x is None else format(x, spec)

    for coll in order:
        sizes = sorted({k[1] for k in keys if k[0] == coll})
        if not sizes:
            continue
        print(f"\n{coll}: out of place ms (fp32) / in place ÷ out / bf16 ÷ fp32\n")
        print("| size | " + " | ".join(algos) + " |")
        print("|---:|" + "---|" * len(algos))
        for s in sizes:
            cells = []
            for a in algos:
                k = (coll, s, a)
                oop = med([d[k]["oop_us"] for d in fp.values() if k in d])
                ip = med([d[k]["ip_us"] / d[k]["oop_us"] for d in fp.values()
                          if k in d and d[k]["ip_us"] > 0])
                wb = med([bf[j][k]["oop_us"] / fp[j][k]["oop_us"]
                          for j in fp if j in bf and k in bf[j] and k in fp[j]])
                cells.append(f"{show(oop and oop / 1000, '.3g')} / {show(ip, '.2f')} / "
                             f"{show(wb, '.2f')}")
            print(f"| {size_text(s)} | " + " | ".join(cells) + " |")
    wrong = sum(r["oop_wrong"] + max(r["ip_wrong"], 0) for w in runs.values()
                for rows in w.values() for r in rows)
    print(f"\n#wrong over all runs: {wrong}")


# ---- main ------------------------------------------------------------------

def main(argv):
    ap = argparse.ArgumentParser(prog="bench/report.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")

    def add(name, fn, short, *arguments):
        p = sub.add_parser(name, help=short, description=inspect.cleandoc(fn.__doc__),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        for a, kw in arguments:
            p.add_argument(*a, **kw)
        p.set_defaults(fn=fn)

    add("coll-table", coll_table, "per-configuration tables of bench coll runs",
        (["--summary"], dict(action="store_true",
                             help="one summary row per configuration, no tables")),
        (["files"], dict(nargs="+", metavar="FILE.jsonl")))
    add("noise", noise, "how finely sets of runs rank the algorithms", (["dirs"], dict(nargs="+", metavar="DIR")))
    add("rules", rules, "bench tune --history's rules priced on runs", (["histdir"], dict(metavar="HISTDIR")),
        (["evaldirs"], dict(nargs="+", metavar="EVALDIR")))
    add("ratio", ratio, "one algorithm's time over another's, per file", (["a"], dict(metavar="A")), (["b"], dict(metavar="B")),
        (["files"], dict(nargs="+", metavar="FILE")))
    add("a2a-window", a2a_window, "all-to-all, one partner at a time against 8", (["files"], dict(nargs="+", metavar="FILE.jsonl")))
    add("one-node-ar", one_node_ar, "short all-reduces on one node", (["files"], dict(nargs="+", metavar="FILE.jsonl")))
    add("wire-place", wire_place, "in place / out of place, bf16 / fp32", (["files"], dict(nargs="+", metavar="FILE.jsonl")))
    args = ap.parse_args(argv)
    if args.cmd == "noise" and len(args.dirs) < 2:
        ap.error("noise needs at least two directories")
    args.fn(args)


if __name__ == "__main__":
    main(sys.argv[1:])
