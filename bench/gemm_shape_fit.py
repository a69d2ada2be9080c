#!/usr/bin/env python3
"""Fits the planner's GEMM time model to measured per-shape GEMM rates.

The planner (src/plan/cost_full.c, plan_gemm_time) times one GEMM call of
(m x k)(k x n) as

    t = gemm_call_s + 2 m n k / (gemm_flops * e),  e = 1 / (1 + h/m + h/n + h/k)

with gemm_flops the machine's large-shape rate, h its `gemm_half_dim` and
gemm_call_s the fixed time of a call (launch and tail). Given gemm_flops
(--rate: the best large-shape rate, measured apart), this script finds h and
gemm_call_s that minimise the squared log error of the predicted rates over a
table of measurements, by a grid search (h in steps of 2, gemm_call_s in steps
of 0.25 us), and prints them with the errors they leave.

Input, either
  - a CSV with a header naming at least m, n, k and flops (FLOP/s), and
    optionally b (a batch of b products; rows with b > 1 are skipped unless
    --batched) and dtype; or
  - a GEMM performance table in OpenXLA's text format
    (xla/service/gpu/model/default_matmul_perf_table.txtpb, or the older
    matmul_interpolator_data.h that embeds it): pick the GPU with --arch
    (sm_90, gfx942, ...) and the number format with --dtype (default bf16).

A shape listed twice keeps its later entry. The last line is the fit as
JSON. docs/planner.md ("Calibrating the GEMM curve") gives the fits of the
presets. Uses the standard library only.
"""
import argparse
import csv
import json
import math
import re
import statistics
import sys


def parse_textproto(text):
    """Nested text-format protobuf -> list of (name, value) pairs; a value
    is a string, a number or a nested list."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[{}:]|[^\s{}:"]+', re.sub(r"#[^\n]*", "", text))
    pos = 0

    def block():
        nonlocal pos
        out = []
        while pos < len(tokens) and tokens[pos] != "}":
            name = tokens[pos]
            pos += 1
            if tokens[pos] == ":":
                pos += 1
            if tokens[pos] == "{":
                pos += 1
                out.append((name, block()))
                pos += 1  # the closing brace
            else:
                tok = tokens[pos]
                pos += 1
                out.append((name, tok[1:-1] if tok.startswith('"') else float(tok)))
        return out

    return block()


def dedupe(rows):
    """(b, m, n, k, flops) rows, a shape listed twice keeping its later entry."""
    last = {}
    for r in rows:
        last[r[:4]] = r
    return list(last.values())


def rows_from_xla(text, arch, dtype):
    start = text.find('R"pb(')  # the header that embeds the table
    if start >= 0:
        text = text[start + 5 : text.find(')pb"', start)]
    rows, archs = [], []
    for name, arch_entry in parse_textproto(text):
        if name != "entries":
            continue
        fields = dict((k, v) for k, v in arch_entry if k == "key")
        archs.append(fields.get("key"))
        if fields.get("key") != arch:
            continue
        value = next(v for k, v in arch_entry if k == "value")
        for name2, e in value:
            if name2 != "entries":
                continue
            shape = {k: v for k, v in e if k in ("b", "m", "n", "k")}
            for k, f in e:
                if k != "flops":
                    continue
                d = dict(f)
                want = "%sx%s->%s" % (dtype, dtype, dtype)
                if d["key"].lower() == want.lower():
                    dims = (int(shape.get("b", 1)), int(shape["m"]), int(shape["n"]), int(shape["k"]))
                    rows.append(dims + (d["value"],))
    if not rows:
        sys.exit("gemm_shape_fit: no %s rows for arch %s (the table has: %s)"
                 % (dtype, arch, ", ".join(map(str, archs))))
    return rows


def rows_from_csv(path, dtype):
    rows = []
    with open(path) as f:
        reader = csv.DictReader(f, skipinitialspace=True)
        reader.fieldnames = [name.strip().lower() for name in reader.fieldnames or []]
        missing = [c for c in ("m", "n", "k", "flops") if c not in reader.fieldnames]
        if missing:
            sys.exit("gemm_shape_fit: %s: the header lacks %s" % (path, ", ".join(missing)))
        for r in reader:
            if "dtype" in r and r["dtype"].strip().lower() != dtype.lower():
                continue
            b = int(r.get("b") or 1)
            rows.append((b, int(r["m"]), int(r["n"]), int(r["k"]), float(r["flops"])))
    if not rows:
        sys.exit("gemm_shape_fit: no %s rows in %s" % (dtype, path))
    return rows


def predict(rate, h, call_s, m, n, k):
    """The planner's rate for one call of (m x k)(k x n)."""
    work = 2.0 * m * n * k
    return work / (call_s + work * (1 + h / m + h / n + h / k) / rate)


def errors(rows, rate, h, call_s):
    return [predict(rate, h, call_s, m, n, k) / f - 1 for m, n, k, f in rows]


def summary(err):
    a = sorted(abs(e) for e in err)
    p90 = a[min(len(a) - 1, int(math.ceil(0.9 * len(a))) - 1)]
    return "median |error| %.3f, 90th percentile %.3f, max %.3f" % (statistics.median(a), p90, a[-1])


def fit(rows, rate):
    best = None
    for hi in range(0, 1001):
        h = 2.0 * hi
        for ci in range(0, 121):
            c = ci / 4e6
            s = sum(math.log1p(e) ** 2 for e in errors(rows, rate, h, c))
            if best is None or s < best[0]:
                best = (s, h, c)
    return best[1], best[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", help="CSV (m,n,k,flops[,b,dtype]) or an OpenXLA GEMM table")
    ap.add_argument("--rate", type=float, required=True, help="gemm_flops: the large-shape rate, FLOP/s")
    ap.add_argument("--arch", default="sm_90", help="the GPU of an OpenXLA table (default sm_90)")
    ap.add_argument("--dtype", default="bf16", help="number format (default bf16)")
    ap.add_argument("--batched", action="store_true", help="keep b > 1 rows, as b*m rows")
    ap.add_argument("--check", nargs=2, type=float, metavar=("H", "CALL_S"), action="append",
                    default=[], help="also print the errors of this h and gemm_call_s")
    a = ap.parse_args()
    if a.rate < 1e9:
        sys.exit("gemm_shape_fit: --rate is in FLOP/s (e.g. 7.945e14), not %g" % a.rate)
    text = open(a.table).read()
    if "entries" in text and "{" in text:
        rows = rows_from_xla(text, a.arch, a.dtype)
    else:
        rows = rows_from_csv(a.table, a.dtype)
    rows = dedupe(rows)
    shapes = [(b * m if a.batched else m, n, k, f) for b, m, n, k, f in rows if a.batched or b == 1]
    if not shapes:
        sys.exit("gemm_shape_fit: no single products (b = 1) in the table; --batched keeps the others")
    h, c = fit(shapes, a.rate)
    err = errors(shapes, a.rate, h, c)
    print("%d shapes, gemm_flops %.4g" % (len(shapes), a.rate))
    print("fit: gemm_half_dim %g, gemm_call_s %.3g: %s" % (h, c, summary(err)))
    worst = max(range(len(err)), key=lambda i: abs(err[i]))
    m, n, k, f = shapes[worst]
    print("largest error: %dx%dx%d, measured %.4g FLOP/s, predicted %.4g"
          % (m, n, k, f, predict(a.rate, h, c, m, n, k)))
    for ch, cc in a.check:
        print("h %g, gemm_call_s %.3g: %s" % (ch, cc, summary(errors(shapes, a.rate, ch, cc))))
    if h >= 2000 or c >= 30e-6:
        print("(the fit is at the search's edge: h 2000 or 30 us per call)")
    mags = [abs(e) for e in err]
    print(json.dumps({"bench": "gemm_shape_fit", "shapes": len(shapes), "gemm_flops": a.rate,
                      "gemm_half_dim": h, "gemm_call_s": c,
                      "median_abs_error": statistics.median(mags), "max_abs_error": max(mags)}))


if __name__ == "__main__":
    main()
