#!/usr/bin/python3
"""Issue 50's measurements: fp32 against bf16-mixed, side by side in one run.

  /usr/bin/python3 bench/precision.py [--build build] [--rounds 2] [--reps 3]
      [--model 124m|tiny] [--shapes short,long] [--cores 1,2] [--grid2 2x1x1x1]
      [--cluster GRID] [--rate 1gbit] [--delay 0] [--out FILE]

GPT-2 124M (L=12, C=768, NH=12, V=50257) one training step at B=4, T=64
("short") and B=1, T=1024 ("long"), on one core (one rank, one thread) and
on two cores (--grid2 on two ranks of one thread; PyTorch on two threads):
fourfold fp32, fourfold bf16-mixed with its products emulated on the BLAS
and on oneDNN, PyTorch fp32 and PyTorch's torch.autocast("cpu",
dtype=torch.bfloat16) (bench/gpt_torch_bench.py --amp bf16, with the same
OpenBLAS, OMP_WAIT_POLICY=PASSIVE: its best). The five alternate within
each round. Each run is the median of --reps steps after 2 warm-ups; the
table gives the median over rounds, the resident set (the largest process's
maximum, /usr/bin/time's %M: with mpirun, the largest rank) and the bytes
each fourfold rank sent per step (the most of any rank; ff_bench_gpt's
counters).

With --cluster GRID the same model (short) also runs on the emulated
cluster of bench/cluster.sh (2 nodes of 2 ranks, links of --rate, --delay
microseconds one way), fp32 against bf16-mixed (products: auto),
alternating: choose GRID with Z across the nodes (e.g. 2x1x2x1: X within a
node, Z between), where bf16's halved weight gathers cross the slow link.
Needs root (network namespaces).

The first lines printed are the machine; the JSON lines of every run go to
--out (default /tmp/fourfold-bench/precision.jsonl), outside the tree.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"124m": ["--L", "12", "--C", "768", "--NH", "12", "--maxT", "1024"],
          "tiny": ["--L", "2", "--C", "128", "--NH", "4", "--maxT", "1024"]}
SHAPES = {"short": ["--B", "4", "--T", "64"], "long": ["--B", "1", "--T", "1024"]}
FF_CONFIGS = [
    ("fourfold fp32", ["--precision", "fp32"]),
    ("fourfold bf16-mixed, emulated", ["--precision", "bf16-mixed", "--bf16-products", "emulated"]),
    ("fourfold bf16-mixed, oneDNN", ["--precision", "bf16-mixed", "--bf16-products", "onednn"]),
]
PT_CONFIGS = [("PyTorch fp32", "none"), ("PyTorch autocast bf16", "bf16")]


def env_mpi():
    e = dict(os.environ)
    e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1",
             OPENBLAS_NUM_THREADS="1")
    return e


def timed(cmd, env):
    """Runs cmd under /usr/bin/time; returns (its JSON line, max RSS in KiB)."""
    p = subprocess.run(["/usr/bin/time", "-f", "maxrss %M"] + cmd, env=env, cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout
    js = [ln for ln in out.splitlines() if ln.startswith("{")]
    rss = re.findall(r"^maxrss (\d+)$", out, re.M)
    if p.returncode or not js or not rss:
        sys.stderr.write(out[-3000:])
        return None, None
    return json.loads(js[-1]), int(rss[-1])


def machine(bench):
    flags = ""
    model = "?"
    with open("/proc/cpuinfo") as f:
        for ln in f:
            if ln.startswith("flags") and not flags:
                flags = ln.split(":", 1)[1].split()
            if ln.startswith("model name") and model == "?":
                model = ln.split(":", 1)[1].strip()
    has = lambda x: "yes" if x in flags else "no"
    print(f"# {os.uname().nodename}, {os.cpu_count()} cores, load "
          f"{' '.join(open('/proc/loadavg').read().split()[:3])}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}")
    print(f"# {model}: avx512f {has('avx512f')}, avx512_bf16 {has('avx512_bf16')}, "
          f"amx_bf16 {has('amx_bf16')}; fourfold {bench}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="124m", choices=sorted(MODELS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shapes", default="short,long")
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--grid2", default="2x1x1x1")
    ap.add_argument("--cluster", default="")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay", default="0")
    ap.add_argument("--out", default=os.path.join(
        os.environ.get("FF_BENCH_OUT", "/tmp/fourfold-bench"), "precision.jsonl"))
    a = ap.parse_args()
    MODEL = MODELS[a.model]
    bench = os.path.join(ROOT, a.build, "bench", "ff_bench_gpt")
    if not os.access(bench, os.X_OK):
        sys.exit(f"precision.py: build first: scripts/build.sh {a.build}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    machine(bench)
    env = env_mpi()
    blas = subprocess.run(["ldd", bench], stdout=subprocess.PIPE, text=True).stdout
    m = re.search(r"libopenblas\S* => (\S+)", blas)
    penv = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    if m:
        penv["LD_LIBRARY_PATH"] = os.path.dirname(m.group(1)) + (
            ":" + penv["LD_LIBRARY_PATH"] if penv.get("LD_LIBRARY_PATH") else "")
    rows = {}
    log = open(a.out, "a")

    def record(key, js, rss):
        if js is None:
            rows.setdefault(key, {"failed": True})
            return
        js["maxrss_kib"] = rss
        log.write(json.dumps(js) + "\n")
        log.flush()  # (a run cut short keeps what it measured)
        r = rows.setdefault(key, {"ms": [], "rss": [], "sent": None})
        r["ms"].append(js["median_ms"])
        if rss is not None:
            r["rss"].append(rss)
        if "sent_per_step_max" in js:
            r["sent"] = js["sent_per_step_max"]

    for shape in a.shapes.split(","):
        for cores in [int(c) for c in a.cores.split(",")]:
            grid, np_ = ("1x1x1x1", 1) if cores == 1 else (a.grid2, cores)
            for rnd in range(a.rounds):
                for label, opts in FF_CONFIGS:
                    cmd = ["mpirun", "--bind-to", "none", "-np", str(np_), bench, "--grid", grid,
                           "--threads", "1", "--reps", str(a.reps), "--warmup", "2", "--V", "50257",
                           "--label", label] + MODEL + SHAPES[shape] + opts
                    record((shape, cores, label), *timed(cmd, env))
                for label, amp in PT_CONFIGS:
                    cmd = ["/usr/bin/python3", "bench/gpt_torch_bench.py", "--threads", str(cores),
                           "--warmup", "2", "--iters", str(a.reps), "--V", "50304", "--amp", amp
                           ] + MODEL + SHAPES[shape]
                    e = dict(penv, OPENBLAS_NUM_THREADS=str(cores))
                    record((shape, cores, label), *timed(cmd, e))
    if a.cluster:
        for rnd in range(a.rounds):
            for label, prec in [("fourfold fp32", "fp32"), ("fourfold bf16-mixed", "bf16-mixed")]:
                cmd = ["bench/cluster.sh", "-n", "2", "-m", "2", "-r", a.rate, "-d", a.delay,
                       "--", bench, "--grid", a.cluster, "--threads", "1", "--reps", str(a.reps),
                       "--warmup", "2", "--V", "50257", "--label", label, "--precision", prec
                       ] + MODEL + SHAPES["short"]
                js, _ = timed(cmd, env)  # the ranks are no children of time here: no RSS
                record(("short", f"cluster {a.cluster} {a.rate}", label), js, None)
    log.close()
    print(f"{'shape':6} {'cores':24} {'configuration':32} {'step ms (rounds)':>22} "
          f"{'median':>8} {'max RSS MiB':>11} {'sent MiB/step':>13}")
    for (shape, cores, label), r in rows.items():
        if r.get("failed"):
            print(f"{shape:6} {str(cores):24} {label:32} failed (above)")
            continue
        ms = ", ".join(f"{x:.0f}" for x in r["ms"])
        sent = "-" if r["sent"] is None else f"{r['sent'] / 1048576:.1f}"
        rss = f"{max(r['rss']) / 1024:.0f}" if r["rss"] else "-"
        print(f"{shape:6} {str(cores):24} {label:32} {ms:>22} {statistics.median(r['ms']):8.0f} "
              f"{rss:>11} {sent:>13}")
    print(f"JSON lines appended to {a.out}")


if __name__ == "__main__":
    main()
