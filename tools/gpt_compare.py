#!/usr/bin/python3
"""Compare fourfold's GPT-2 run with the PyTorch oracle's (gpt_oracle.py
--dtype float64 --ff DIR), against bounds derived from float32's unit
roundoff (docs/testing.md, "The PyTorch oracle's bounds").

  gpt_compare.py DIR [--plain PLAIN]...

Reads from DIR (a = fourfold, from `test_gpt --dump DIR`; b = the oracle, in
float64, following fourfold's trajectory):
  model.bin                         the initial parameters (v3, float32)
  ff_logits.bin / oracle_logits.bin step 0's logits, raw (B, T, Vp)
  ff_grads_S.bin / oracle_grads_S.bin
                                    step S's gradients at fourfold's parameters
                                    before step S (v3 layout), S = 0 .. steps-1
  ff_params.bin, ff_adam_m.bin, ff_adam_v.bin /
  oracle_params.bin, oracle_adam_m.bin, oracle_adam_v.bin
                                    the parameters and AdamW's moments after
                                    the steps (the oracle's: torch's AdamW fed
                                    fourfold's gradients)
  ff.json / oracle.json             losses, gradient norms, learning rates and
                                    hyperparameters

Every tensor is compared by its norm-wise relative error
||a - b||_2 / ||b||_2 (Frobenius; the parameters relative to their change
over the run, ||b - theta_0||_2) against its bound:
  logits, step 0        (11L + 3) gamma_K
  losses, each step     (11L + 5) gamma_K
  gradients, each step  (22L + 9) gamma_K  per tensor; gamma_K = K u / (1 - K u),
                        u = 2^-24, K = max(Vp, B T, 4C) + 8
  gradient norms        2u (fourfold's norm of its own gradients)
  learning rates        2u
  parameters, moments   a running error bound of fourfold's float32 AdamW
                        (every operation, its float32 hyperparameters, its
                        clipping) around torch's float64 AdamW on the same
                        gradients, element by element, taken norm-wise
bf16-mixed (the oracle's --precision bf16-mixed, from oracle.json): both
runs round the same operands to bf16, fourfold its float32 values, the
oracle its float64 ones; where the two straddle a bf16 rounding boundary
they round apart, by at most one bf16 ulp, 2 u_b |x| (u_b = 2^-8), so each
rounded operand on the way adds at most 2 u_b to a tensor's norm-wise
error (the weights add nothing: both round the same float32 master). On
the way to the logits and the loss: the 4L + 1 inputs of the products with
weights and attention's 4L operands (Q, K, P, V per layer); to the
gradients, also the 4L + 1 output gradients of the products with weights
and attention's 2L (dO and dS per layer):
  logits, losses        + (8L + 1) 2 u_b
  gradients             + (14L + 2) 2 u_b
a worst case (every element rounded apart) that a run without rounding
would meet too; so, with --plain PLAIN (the same oracle without the bf16
rounding, --precision fp32, run on the same files in PLAIN), every step-0
gradient tensor and the logits must also be strictly nearer to the bf16
oracle's than to the plain one's: fourfold rounds what the oracle rounds.
Also: the padded vocabulary rows V..Vp of every gradient, of the parameters
and of the moments exactly zero; equal configs and shapes; finite values;
fourfold's hyperparameters the float32 values of the oracle's; and the
bound's own float64 AdamW (numpy) equal to torch's to 1e-12, so that the
bound describes the optimizer the oracle ran.
Exit 0 if everything is within its bound, 1 otherwise (or on a missing or
malformed file).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch as gt  # noqa: E402

U = 2.0 ** -24  # float32's unit roundoff


def gamma(k):
    return k * U / (1 - k * U)


def norm(x):
    return float(np.sqrt(np.sum(np.square(np.asarray(x, dtype=np.float64)))))


def rel_err(a, b, den=None):
    """||a-b|| / den (default ||b||) in float64; 0 if both are zero; inf if
    anything is not finite or only the denominator is zero."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf")
    num = norm(a - b)
    den = norm(b) if den is None else den
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def load_json(path):
    with open(path) as f:
        d = json.load(f)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: not a JSON object")
    return d


def adam_r_max(b1, b2, t):
    """max |m_hat| / sqrt(v_hat) after t steps of any gradients (Cauchy-Schwarz
    on m_t = (1-b1) sum b1^(t-k) x_k, v_t = (1-b2) sum b2^(t-k) x_k^2): the
    largest size of an AdamW update direction."""
    s = sum((b1 * b1 / b2) ** j for j in range(t))
    return (1 - b1) / (1 - b1 ** t) * math.sqrt((1 - b2 ** t) / (1 - b2) * s)


def adamw_bound(p0, grads, lrs, hp, decay):
    """Float64 AdamW on the flat gradients `grads` (fourfold's), as torch
    defines it, and beside it a first-order running error bound of fourfold's
    float32 evaluation (src/nn/gpt_optim.c) of the same steps.

    p0: flat initial parameters; lrs: the exact rates; hp: the oracle's
    hyperparameters; decay: flat 0/1 mask of the weight-decayed elements.
    Each float32 operation z = x op y is within u|z| of its exact value; the
    float32 hyperparameters differ from the oracle's by their representation
    error; the clipping factor is within 4u, the rate within 2u (relative).
    Returns (p, m, v) and their elementwise bounds (Ep, Em, Ev)."""
    b1, b2, eps, wd, clip = hp["beta1"], hp["beta2"], hp["eps"], hp["wd"], hp["clip"]
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    db1, db2 = abs(f32(b1) - b1), abs(f32(b2) - b2)
    deps, dwd = abs(f32(eps) - eps), abs(f32(wd) - wd)
    wdv = wd * decay
    p = p0.astype(np.float64)
    m, v = np.zeros_like(p), np.zeros_like(p)
    Ep, Em, Ev = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    for s, (g, lr) in enumerate(zip(grads, lrs)):
        t = s + 1
        n = norm(g)
        c = min(1.0, clip / (n + 1e-6))
        x = c * g.astype(np.float64)
        ax = np.abs(x)
        Ex = 5 * U * ax  # the factor's 4u and the product's u
        m1 = b1 * m + (1 - b1) * x
        Em = (b1 * Em + (db1 + U * b1) * np.abs(m) + (1 - b1) * Ex + (db1 + U * (1 - b1)) * ax +
              U * np.abs(m1))
        v1 = b2 * v + (1 - b2) * x * x
        Ev = (b2 * Ev + (db2 + U * b2) * v + (1 - b2) * 2 * ax * Ex +
              (db2 + 2 * U * (1 - b2)) * x * x + U * v1)
        m, v = m1, v1
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t  # 1 - powf(b, t): powf within 1 ulp
        Ebc1 = t * b1 ** (t - 1) * db1 + 2 * U * b1 ** t + U * bc1
        Ebc2 = t * b2 ** (t - 1) * db2 + 2 * U * b2 ** t + U * bc2
        mh, vh = m / bc1, v / bc2
        Emh = Em / bc1 + np.abs(mh) * (Ebc1 / bc1 + U)
        Evh = Ev / bc2 + vh * (Ebc2 / bc2 + U)
        sq = np.sqrt(vh)
        with np.errstate(divide="ignore", invalid="ignore"):
            Esq = np.minimum(np.where(sq > 0, Evh / sq, np.inf), np.sqrt(Evh)) + U * sq
        d = sq + eps
        Ed = Esq + deps + U * d
        r = mh / d
        R = adam_r_max(b1, b2, t)
        with np.errstate(divide="ignore", invalid="ignore"):
            Er = np.where(d > Ed, (Emh + np.abs(r) * Ed) / (d - Ed), np.inf) + U * np.abs(r)
        # no update is longer than R (1e-5: the rounding of m and v so far)
        Er = np.minimum(Er, R * (1 + 1e-5) + np.abs(r))
        w = wdv * p
        Ew = wdv * Ep + dwd * decay * np.abs(p) + U * np.abs(w)
        tt = r + w
        Et = Er + Ew + U * np.abs(tt)
        q = lr * tt
        Eq = lr * Et + 2 * U * lr * np.abs(tt) + U * np.abs(q)
        p = p - q
        Ep = Ep + Eq + U * np.abs(p)
    return (p, m, v), (Ep, Em, Ev)


def flat(tensors):
    return np.concatenate([np.asarray(tensors[n], dtype=np.float64).ravel()
                           for n in gt.PARAM_NAMES])


def unflat(x, cfg):
    out, off = {}, 0
    for n, shape in gt.param_shapes(cfg).items():
        k = int(np.prod(shape))
        out[n] = x[off:off + k].reshape(shape)
        off += k
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--plain", action="append", default=[],
                    help="bf16-mixed: an oracle with less rounding's directory (repeatable: "
                         "the oracle without rounding, the one with attention in fp32)")
    a = ap.parse_args()
    D = a.dir
    p = lambda name: os.path.join(D, name)  # noqa: E731
    fails = []

    def check(ok, msg):
        if not ok:
            fails.append(msg)
        return "ok" if ok else "FAIL"

    try:
        ffj, orj = load_json(p("ff.json")), load_json(p("oracle.json"))
        if orj.get("dtype") != "float64" or orj.get("trajectory") != "fourfold":
            raise ValueError("the oracle must run with --dtype float64 --ff DIR (its "
                             f"oracle.json says dtype {orj.get('dtype')}, trajectory "
                             f"{orj.get('trajectory')}): the bounds take it as exact "
                             "and at fourfold's points")
        steps = int(orj["steps"])
        if int(ffj["steps"]) != steps:
            raise ValueError(f"ff.json has {ffj['steps']} steps, oracle.json {steps}")
        cfg, p0 = gt.read_checkpoint(p("model.bin"))
        ga, gb = [], []
        for s in range(steps):
            ca, ta = gt.read_checkpoint(p(f"ff_grads_{s}.bin"))
            cb, tb = gt.read_checkpoint(p(f"oracle_grads_{s}.bin"), dtype="<f8")
            if ca != cfg or cb != cfg:
                raise ValueError(f"step {s}: gradient configs differ: ff {ca}, oracle {cb}, "
                                 f"model {cfg}")
            ga.append(ta)
            gb.append(tb)
        sa, sb = {}, {}
        for key in ("params", "adam_m", "adam_v"):
            ca, sa[key] = gt.read_checkpoint(p(f"ff_{key}.bin"))
            cb, sb[key] = gt.read_checkpoint(p(f"oracle_{key}.bin"), dtype="<f8")
            if ca != cfg or cb != cfg:
                raise ValueError(f"{key}: configs differ: ff {ca}, oracle {cb}, model {cfg}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"FAIL: {e}")
        return 1
    L, C, V, Vp = cfg["L"], cfg["C"], cfg["V"], cfg["Vp"]
    B, T = int(orj["B"]), int(orj["T"])
    K = max(Vp, B * T, 4 * C) + 8
    tau_logits, tau_loss, tau_grad = ((11 * L + 3) * gamma(K), (11 * L + 5) * gamma(K),
                                      (22 * L + 9) * gamma(K))
    mixed = orj.get("precision", "fp32") == "bf16-mixed"
    if mixed:  # (the docstring derives it)
        UB = 2.0 ** -8
        tau_logits += (8 * L + 1) * 2 * UB
        tau_loss += (8 * L + 1) * 2 * UB
        tau_grad += (14 * L + 2) * 2 * UB
    print(f"norm-wise relative error ||ff - oracle|| / ||oracle|| per tensor; u = 2^-24, "
          f"K = max(Vp, B*T, 4C) + 8 = {K}, gamma_K = {gamma(K):.3e}")
    print(f"bounds: logits (11L+3) gamma_K = {tau_logits:.3e}, losses (11L+5) gamma_K = "
          f"{tau_loss:.3e}, gradients (22L+9) gamma_K = {tau_grad:.3e}"
          + (", each + bf16-mixed's (8L+1) 2u_b, (8L+1) 2u_b, (14L+2) 2u_b" if mixed else ""))
    plains = []  # (label, step-0 gradients, directory)
    for d in a.plain if mixed else []:
        try:
            cp, pg = gt.read_checkpoint(os.path.join(d, "oracle_grads_0.bin"), dtype="<f8")
            pj = load_json(os.path.join(d, "oracle.json"))
            if pj.get("precision", "fp32") == "fp32":
                label = "plain oracle"
            elif pj.get("attention") == "fp32":
                label = "fp32-attention oracle"
            else:
                label = None
            if cp != cfg or label is None:
                raise ValueError(f"{d}: not an oracle of this model with less rounding")
        except (OSError, ValueError) as e:
            print(f"FAIL: {e}")
            return 1
        plains.append((label, pg, d))

    # fourfold's hyperparameters: the float32 values of the oracle's
    hp = {k: float(orj[k]) for k in ("lr", "min_lr_frac", "wd", "beta1", "beta2", "eps",
                                     "clip")}
    try:
        fh = ffj["hparams"]
        for k, val in hp.items():
            check(np.float32(fh[k]) == np.float32(val),
                  f"hyperparameter {k}: fourfold {fh[k]}, oracle {val} (float32 "
                  f"{float(np.float32(val)):.9g})")
        check(int(fh["warmup"]) == int(orj["warmup"]),
              f"warmup: fourfold {fh['warmup']}, oracle {orj['warmup']}")
    except (KeyError, TypeError, ValueError) as e:
        fails.append(f"ff.json hparams: missing or malformed ({e!r})")

    # step 0: gradients per tensor, logits, loss
    print(f"step 0 gradients:\n{'tensor':<10} {'shape':<18} {'||oracle||':>11} "
          f"{'rel err':>10} {'err/bound':>10}")
    worst_grad = (0.0, "-", -1)
    for s in range(steps):
        for name in gt.PARAM_NAMES:
            err = rel_err(ga[s][name], gb[s][name])
            ok = check(err <= tau_grad, f"step {s} gradient {name}: {err:.3e} > {tau_grad:.3e}")
            if s == 0:
                print(f"{name:<10} {str(ga[s][name].shape):<18} {norm(gb[s][name]):11.4e} "
                      f"{err:10.3e} {err / tau_grad:10.2e}  {ok}", end="")
                for label, pg, _ in plains:
                    ep = rel_err(ga[s][name], pg[name])
                    print(f"  {label} {ep:.3e}: {check(err < ep, f'{name}: gradient nearer the {label} ({ep:.3e}) than the bf16 one ({err:.3e})')}", end="")
                print()
            if not err / tau_grad <= worst_grad[0]:
                worst_grad = (err / tau_grad, name, s)
        for who, g in (("ff", ga[s]), ("oracle", gb[s])):
            pad = g["wte"][V:]
            check(not np.any(pad != 0), f"step {s}: {who} wte gradient rows {V}..{Vp} "
                  f"not exactly zero")
    print(f"steps 0..{steps - 1}: worst gradient {worst_grad[1]} at step {worst_grad[2]}, "
          f"{worst_grad[0]:.2e} of its bound; padded wte rows zero in every gradient")

    logit_ratio = float("inf")
    try:
        n = B * T * Vp
        la = np.fromfile(p("ff_logits.bin"), dtype="<f4")
        lb = np.fromfile(p("oracle_logits.bin"), dtype="<f8")
        if lb.size != n or la.size != n:
            raise ValueError(f"logits hold {la.size} (ff) and {lb.size} (oracle) values, "
                             f"want B*T*Vp={n}")
        err = rel_err(la.reshape(B, T, Vp)[..., :V], lb.reshape(B, T, Vp)[..., :V])
        logit_ratio = err / tau_logits
        print(f"logits {str((B, T, V)):<18} rel err {err:.3e}, {logit_ratio:.2e} of its bound  "
              f"{check(err <= tau_logits, f'logits: {err:.3e} > {tau_logits:.3e}')}")
        for label, _, d in plains:
            lp = np.fromfile(os.path.join(d, "oracle_logits.bin"), dtype="<f8")
            ep = rel_err(la.reshape(B, T, Vp)[..., :V], lp.reshape(B, T, Vp)[..., :V])
            print(f"logits against the {label}: rel err {ep:.3e}  "
                  f"{check(err < ep, f'logits nearer the {label} ({ep:.3e}) than the bf16 one ({err:.3e})')}")
    except (OSError, ValueError) as e:
        fails.append(f"logits: {e}")

    loss_ratio = 0.0
    try:
        la, lb = [float(ffj["loss"])] + list(map(float, ffj["losses"])), \
            [float(orj["loss"])] + list(map(float, orj["losses"]))
        if len(la) != steps + 1 or len(lb) != steps + 1:
            raise ValueError(f"ff has {len(la) - 1} step losses, oracle {len(lb) - 1}")
        for i, (x, y) in enumerate(zip(la, lb)):
            err = rel_err(x, y)
            what = "evaluation loss" if i == 0 else f"step {i - 1} loss"
            check(err <= tau_loss, f"{what}: ff {x:.9g}, oracle {y:.12g}: {err:.3e} > "
                  f"{tau_loss:.3e}")
            if not err / tau_loss <= loss_ratio:  # NaN too
                loss_ratio = err / tau_loss
        print(f"losses: evaluation and {steps} steps, worst {loss_ratio:.2e} of the bound")
    except (KeyError, TypeError, ValueError) as e:
        fails.append(f"losses: missing or malformed ({e!r})")

    # the optimizer's inputs: rates and gradient norms
    try:
        lrs = [gt.lr_at(s, steps, hp["lr"], int(orj["warmup"]), hp["min_lr_frac"])
               for s in range(steps)]
        for s in range(steps):
            lr_ff, n_ff, n_or = float(ffj["lrs"][s]), float(ffj["grad_norms"][s]), \
                float(orj["grad_norms"][s])
            check(abs(lr_ff - lrs[s]) <= 2 * U * lrs[s],
                  f"step {s} learning rate: ff {lr_ff:.9g}, exact {lrs[s]:.12g}")
            check(abs(n_ff - n_or) <= 2 * U * n_or,
                  f"step {s} gradient norm: ff {n_ff:.9g}, of its gradients {n_or:.12g}")
        print(f"learning rates and gradient norms of {steps} steps: within 2u")
    except (KeyError, TypeError, ValueError, IndexError) as e:
        fails.append(f"rates and norms: missing or malformed ({e!r})")
        lrs = None

    # the state after the steps: fourfold's AdamW against torch's
    if lrs is None:
        return report(fails)
    decay = flat({n: np.full(gt.param_shapes(cfg)[n], 1.0 if n in gt.DECAY_NAMES else 0.0)
                  for n in gt.PARAM_NAMES})
    (pe, me, ve), (Ep, Em, Ev) = adamw_bound(flat(p0), [flat(g) for g in ga], lrs, hp, decay)
    ref = {"params": unflat(pe, cfg), "adam_m": unflat(me, cfg), "adam_v": unflat(ve, cfg)}
    bound = {"params": unflat(Ep, cfg), "adam_m": unflat(Em, cfg), "adam_v": unflat(Ev, cfg)}
    for key in ref:
        e = rel_err(flat(ref[key]), flat(sb[key]))
        check(e <= 1e-12, f"{key}: the bound's AdamW differs from torch's by {e:.2e} "
              f"(relative): the bound would describe another optimizer")
    print(f"after {steps} steps (the parameters relative to their change; bound = "
          f"||running bound||_2):\n{'tensor':<10} {'params err':>10} {'bound':>9} "
          f"{'ratio':>6} {'m err':>10} {'bound':>9} {'ratio':>6} {'v err':>10} {'bound':>9} "
          f"{'ratio':>6}")
    worst_state = {k: (0.0, "-") for k in ref}
    for name in gt.PARAM_NAMES:
        row = f"{name:<10}"
        for key in ("params", "adam_m", "adam_v"):
            b = sb[key][name]
            den = norm(b - p0[name]) if key == "params" else norm(b)
            err = rel_err(sa[key][name], b, den)
            bnd = norm(bound[key][name]) / den if den > 0 else 0.0
            ratio = err / bnd if bnd > 0 else (0.0 if err == 0 else float("inf"))
            check(err <= bnd, f"{key} {name}: {err:.3e} > its bound {bnd:.3e}")
            if not ratio <= worst_state[key][0]:
                worst_state[key] = (ratio, name)
            row += f" {err:10.3e} {bnd:9.2e} {ratio:6.3f}"
        print(row)
    for key in ref:
        pad = sa[key]["wte"][V:]
        check(not np.any(pad != 0), f"ff {key}: wte rows {V}..{Vp} not exactly zero")

    print(f"summary: error/bound worst: gradients {worst_grad[0]:.2e} ({worst_grad[1]}), "
          f"logits {logit_ratio:.2e}, losses {loss_ratio:.2e}, params "
          f"{worst_state['params'][0]:.3f} ({worst_state['params'][1]}), m "
          f"{worst_state['adam_m'][0]:.3f} ({worst_state['adam_m'][1]}), v "
          f"{worst_state['adam_v'][0]:.3f} ({worst_state['adam_v'][1]})")
    return report(fails)


def report(fails):
    if fails:
        for f in fails[:40]:
            print(f"FAIL: {f}")
        if len(fails) > 40:
            print(f"FAIL: ... and {len(fails) - 40} more")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
