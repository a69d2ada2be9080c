#!/usr/bin/env python3
"""Draws a fourfold timeline (the Chrome trace JSON that --trace writes) as an
SVG picture for the docs: one band per rank, compute and waits on its first
lane, each collective in flight on the lanes below.

    python3 tools/trace_svg.py TRACE.json OUT.svg [--title TEXT] [--ranks N]
"""
import json
import sys
from xml.sax.saxutils import escape

COLOURS = {"compute": "#4c78a8", "wait": "#e45756", "comm": "#f2a541"}


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    src, dst = argv[1], argv[2]
    title, max_ranks = "", 1 << 30
    rest = argv[3:]
    while rest:
        if rest[0] == "--title" and len(rest) > 1:
            title, rest = rest[1], rest[2:]
        elif rest[0] == "--ranks" and len(rest) > 1:
            max_ranks, rest = int(rest[1]), rest[2:]
        else:
            sys.exit("unknown argument " + rest[0])
    with open(src) as f:
        data = json.load(f)
    events = [e for e in data["traceEvents"] if e.get("ph") == "X" and e["pid"] < max_ranks]
    if not events:
        sys.exit("no events in " + src)
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e["dur"] for e in events)
    lanes = sorted({(e["pid"], e["tid"]) for e in events})
    width, left, lane_h, top = 1100, 120, 18, 40
    scale = (width - left - 20) / (t1 - t0)
    height = top + lane_h * len(lanes) + 8 * len({p for p, _ in lanes}) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="10">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="18" font-size="13">{escape(title)}</text>']
    y, lane_y, last_pid = top, {}, None
    for pid, tid in lanes:
        if last_pid is not None and pid != last_pid:
            y += 8
        lane_y[(pid, tid)] = y
        label = f"rank {pid}" + ("" if tid == 0 else f" coll {tid}")
        out.append(f'<text x="10" y="{y + 12}">{label}</text>')
        y += lane_h
        last_pid = pid
    for e in events:
        x = left + (e["ts"] - t0) * scale
        w = max(e["dur"] * scale, 0.5)
        ly = lane_y[(e["pid"], e["tid"])]
        colour = COLOURS.get(e.get("cat"), "#999999")
        name = escape(e["name"])
        out.append(f'<rect x="{x:.1f}" y="{ly + 1}" width="{w:.1f}" height="{lane_h - 3}" '
                   f'fill="{colour}" stroke="white" stroke-width="0.5">'
                   f'<title>{name}: {e["dur"] / 1000:.2f} ms</title></rect>')
        if w > 6 * len(e["name"]):
            out.append(f'<text x="{x + 2:.1f}" y="{ly + 12}" fill="white">{name}</text>')
    # time axis
    span_ms = (t1 - t0) / 1000
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
                if span_ms / s <= 12)
    axis_y = y + 10
    t = 0.0
    while t <= span_ms:
        x = left + t * 1000 * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{axis_y}" '
                   f'stroke="#dddddd"/><text x="{x:.1f}" y="{axis_y + 12}" '
                   f'text-anchor="middle">{t:g} ms</text>')
        t += step
    lx = left
    for cat, label in (("compute", "compute (GEMM)"), ("wait", "blocked in wait"),
                       ("comm", "collective in flight")):
        out.append(f'<rect x="{lx}" y="{axis_y + 18}" width="12" height="10" '
                   f'fill="{COLOURS[cat]}"/><text x="{lx + 16}" y="{axis_y + 27}">{label}</text>')
        lx += 160
    out.append("</svg>")
    # the grid lines were drawn last: move them behind the bars
    lines = [s for s in out if s.startswith("<line")]
    body = [s for s in out if not s.startswith("<line")]
    body[2:2] = lines
    with open(dst, "w") as f:
        f.write("\n".join(body) + "\n")


if __name__ == "__main__":
    main(sys.argv)
