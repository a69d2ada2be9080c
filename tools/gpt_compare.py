#!/usr/bin/python3
"""Compare fourfold's GPT-2 outputs with the PyTorch oracle's (gpt_oracle.py).

  gpt_compare.py DIR [--loss-tol 1e-5 --grad-tol 1e-4 --logit-tol 1e-4
                      --losses-tol 1e-4]

Reads from DIR (a = fourfold, b = oracle):
  ff_logits.bin / oracle_logits.bin  raw float32 (B, T, Vp); B, T from oracle.json
  ff_grads.bin  / oracle_grads.bin   v3 checkpoint layout (gradients)
  ff.json       / oracle.json        keys "loss" and "losses"

Metrics:
  loss        relative error |a-b| / |b|
  gradients   per tensor, relative max error max|a-b| / max|b|
              (0 when both are all zero); all 16 tensors
  logits      relative max error over the real V columns
  losses      max over steps of |a_s-b_s| / |b_s|
Also requires the padded wte-gradient rows V..Vp to be exactly zero in both,
equal configs, equal shapes, and finite values.
Exit 0 if everything is within tolerance, 1 otherwise (or on a missing or
malformed file).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch as gt  # noqa: E402


def rel_max_err(a, b):
    """max|a-b| / max|b| in float64; 0 if both are all zero; inf if only b is."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf"), float("nan")
    num = float(np.max(np.abs(a - b))) if a.size else 0.0
    den = float(np.max(np.abs(b))) if b.size else 0.0
    if den == 0.0:
        return (0.0 if num == 0.0 else float("inf")), den
    return num / den, den


def rel_err(a, b):
    a, b = float(a), float(b)
    if not (np.isfinite(a) and np.isfinite(b)):
        return float("inf")
    if b == 0.0:
        return 0.0 if a == 0.0 else float("inf")
    return abs(a - b) / abs(b)


def load_json(path):
    with open(path) as f:
        d = json.load(f)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: not a JSON object")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--loss-tol", type=float, default=1e-5)
    ap.add_argument("--grad-tol", type=float, default=1e-4)
    ap.add_argument("--logit-tol", type=float, default=1e-4)
    ap.add_argument("--losses-tol", type=float, default=1e-4)
    a = ap.parse_args()
    D = a.dir
    p = lambda name: os.path.join(D, name)  # noqa: E731
    fails = []

    try:
        ffj, orj = load_json(p("ff.json")), load_json(p("oracle.json"))
        cfg_a, ga = gt.read_checkpoint(p("ff_grads.bin"))
        cfg_b, gb = gt.read_checkpoint(p("oracle_grads.bin"))
    except (OSError, ValueError) as e:
        print(f"FAIL: {e}")
        return 1
    if cfg_a != cfg_b:
        print(f"FAIL: config differs: ff {cfg_a} vs oracle {cfg_b}")
        return 1
    V, Vp = cfg_b["V"], cfg_b["Vp"]

    print("relative max error = max|ff - oracle| / max|oracle| per tensor")
    print(f"{'tensor':<10} {'shape':<18} {'max|oracle|':>12} {'rel max err':>12} "
          f"{'tol':>8}  ok")
    worst_grad = (-1.0, "-")
    for name in gt.PARAM_NAMES:
        err, den = rel_max_err(ga[name], gb[name])
        ok = err <= a.grad_tol
        if not ok:
            fails.append(f"grad {name}: {err:.3e} > {a.grad_tol:g}")
        if err > worst_grad[0]:
            worst_grad = (err, name)
        print(f"{name:<10} {str(ga[name].shape):<18} {den:12.4e} {err:12.4e} "
              f"{a.grad_tol:8.1e}  {'ok' if ok else 'FAIL'}")

    pad_ok = True
    for who, g in (("ff", ga), ("oracle", gb)):
        pad = g["wte"][V:]
        if pad.size and np.any(pad != 0):
            pad_ok = False
            fails.append(f"{who} wte gradient padded rows {V}..{Vp} not exactly zero "
                         f"(max |.| {float(np.max(np.abs(pad))):.3e})")
    print(f"wte grad padded rows {V}..{Vp} exactly zero in both: "
          f"{'yes' if pad_ok else 'NO'}")

    # logits
    logit_err = float("inf")
    try:
        B, T = int(orj["B"]), int(orj["T"])
        n = B * T * Vp
        la = np.fromfile(p("ff_logits.bin"), dtype="<f4")
        lb = np.fromfile(p("oracle_logits.bin"), dtype="<f4")
        if lb.size != n:
            raise ValueError(f"oracle_logits.bin holds {lb.size} floats, want B*T*Vp={n}")
        if la.size != n:
            raise ValueError(f"ff_logits.bin holds {la.size} floats, want B*T*Vp={n}")
        la = la.reshape(B, T, Vp)[..., :V]
        lb = lb.reshape(B, T, Vp)[..., :V]
        logit_err, den = rel_max_err(la, lb)
        print(f"{'logits':<10} {str((B, T, V)):<18} {den:12.4e} {logit_err:12.4e} "
              f"{a.logit_tol:8.1e}  {'ok' if logit_err <= a.logit_tol else 'FAIL'}")
        if not logit_err <= a.logit_tol:
            fails.append(f"logits: {logit_err:.3e} > {a.logit_tol:g}")
    except (OSError, ValueError, KeyError) as e:
        fails.append(f"logits: {e}")

    # loss and per-step losses
    loss_err = losses_err = float("inf")
    try:
        loss_err = rel_err(ffj["loss"], orj["loss"])
        print(f"loss       ff {float(ffj['loss']):.9f} oracle {float(orj['loss']):.9f} "
              f"rel err {loss_err:.4e} tol {a.loss_tol:.1e}  "
              f"{'ok' if loss_err <= a.loss_tol else 'FAIL'}")
        if not loss_err <= a.loss_tol:
            fails.append(f"loss: {loss_err:.3e} > {a.loss_tol:g}")
    except (KeyError, TypeError, ValueError) as e:
        fails.append(f"loss: missing or malformed ({e!r})")
    try:
        la, lb = list(ffj["losses"]), list(orj["losses"])
        if len(la) != len(lb) or not lb:
            raise ValueError(f"ff has {len(la)} step losses, oracle {len(lb)}")
        errs = [rel_err(x, y) for x, y in zip(la, lb)]
        losses_err = max(errs)
        worst_s = errs.index(losses_err)
        print(f"losses     {len(lb)} steps, max rel err {losses_err:.4e} (step {worst_s}) "
              f"tol {a.losses_tol:.1e}  {'ok' if losses_err <= a.losses_tol else 'FAIL'}")
        if not losses_err <= a.losses_tol:
            fails.append(f"losses: {losses_err:.3e} > {a.losses_tol:g} at step {worst_s}")
    except (KeyError, TypeError, ValueError) as e:
        fails.append(f"losses: missing or malformed ({e!r})")

    print(f"summary: worst grad rel max err {worst_grad[0]:.3e} ({worst_grad[1]}), "
          f"logits {logit_err:.3e}, loss {loss_err:.3e}, losses {losses_err:.3e}")
    if fails:
        for f in fails:
            print(f"FAIL: {f}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
