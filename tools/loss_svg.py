#!/usr/bin/env python3
"""Draws the loss curves of several fourfold runs on shared axes, as one SVG
picture for the docs (a run's own loss.svg has only its curves): each run's
training loss as the mean of each window of steps, and its validation loss
as dots.

    python3 tools/loss_svg.py OUT.svg LABEL=RUN/log.jsonl ... [--title TEXT] [--window N]
"""
import json
import os
import sys
from xml.sax.saxutils import escape

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
W, H, L, R, T, B = 760, 420, 60, 190, 40, 45


def read(path, window):
    steps, val = [], []
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e.get("type") == "step":
                steps.append((e["step"], e["loss"]))
            elif e.get("type") == "val" and e.get("val_loss") is not None:
                val.append((e["step"], e["val_loss"]))
    means = []
    for i in range(0, len(steps), window):
        chunk = steps[i:i + window]
        means.append((sum(s for s, _ in chunk) / len(chunk), sum(x for _, x in chunk) / len(chunk)))
    return means, val


def main(argv):
    title, window, runs, out = "", 50, [], None
    rest = argv[1:]
    while rest:
        a = rest.pop(0)
        if a == "--title" and rest:
            title = rest.pop(0)
        elif a == "--window" and rest:
            window = int(rest.pop(0))
        elif out is None:
            out = a
        elif "=" in a:
            label, path = a.split("=", 1)
            runs.append((label,) + read(path, window))
        else:
            sys.exit(__doc__)
    if out is None or not runs:
        sys.exit(__doc__)
    pts = [p for _, m, v in runs for p in m + v]
    x0, x1 = 0, max(x for x, _ in pts)
    y0, y1 = min(y for _, y in pts), max(y for _, y in pts)
    sx = lambda x: L + (x - x0) / (x1 - x0 or 1) * (W - L - R)
    sy = lambda y: T + (y1 - y) / (y1 - y0 or 1) * (H - T - B)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">step</text>',
           f'<text x="15" y="{(T + H - B) / 2}" transform="rotate(-90 15 {(T + H - B) / 2})" text-anchor="middle">loss</text>']
    for i in range(6):
        y = y0 + (y1 - y0) * i / 5
        x = x0 + (x1 - x0) * i / 5
        svg.append(f'<text x="{L - 5}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        svg.append(f'<text x="{sx(x):.1f}" y="{H - B + 15}" text-anchor="middle">{x:.0f}</text>')
    for k, (label, means, val) in enumerate(runs):
        c = COLOURS[k % len(COLOURS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in means)
        svg.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{path}"/>')
        for x, y in val:
            svg.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{c}"/>')
        ly = T + 20 + 40 * k
        svg.append(f'<line x1="{W - R + 15}" y1="{ly}" x2="{W - R + 40}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        svg.append(f'<text x="{W - R + 45}" y="{ly + 4}">{escape(label)}</text>')
        svg.append(f'<circle cx="{W - R + 27}" cy="{ly + 16}" r="3.5" fill="{c}"/>')
        svg.append(f'<text x="{W - R + 45}" y="{ly + 20}">{escape(label)}, validation</text>')
    svg.append("</svg>")
    with open(out + ".tmp", "w") as f:  # written whole, then renamed
        f.write("\n".join(svg) + "\n")
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main(sys.argv)
