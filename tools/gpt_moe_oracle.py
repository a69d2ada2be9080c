#!/usr/bin/python3
"""The serial mixture-of-experts GPT against PyTorch in float64 (run with
/usr/bin/python3).

  gpt_moe_oracle.py DIR

DIR holds what `test_gpt --dump-moe DIR` (top-2) or `--dump-moe1 DIR`
(top-1, capacity factor 1.25) writes: model.bin (fourfold's MoE checkpoint
format, docs/moe.md; k and the factor are read from its header), batch.bin
(two micro-batches), ff_grads.bin (the gradients of one step over them, the
same layout), ff.json (the step's loss, load-balancing loss and fraction of
assignments dropped) and ff_route.bin (each token's choices, e kept or ~e
dropped: int32 (MoE block, micro-batch, token, k)).

The model is rebuilt from the checkpoint with torch operations, written out
from the definition in docs/moe.md and independently of fourfold's code:
dense blocks as GPT-2 (tools/gpt_torch.py), MoE blocks with a router
softmax(x Wr^T), top-k choices (ties to the lower index), capacity
ceil(F k T / E) per expert and sequence (first choices before second ones,
in position order), gates (top-1 the chosen probability, top-2 the two
renormalised), experts GELU MLPs, and the Switch Transformer's
load-balancing loss coef E sum_e f_e P_e over each micro-batch. The step's
loss is the mean over the micro-batches of the cross-entropy plus the
load-balancing losses. Compared:

- every token's choices and which of them capacity dropped, exactly, and
  the fraction dropped. Where fourfold's float32 rounding may order two
  experts otherwise (their probabilities within the bound of routing(),
  docs/moe.md "Routing across grids"), fourfold's choice is adopted and
  the values are compared at it; anywhere else a different choice fails;
  a batch that drops nothing fails (it would not test the capacity);
- the cross-entropy and the load-balancing loss, relative error;
- every gradient tensor norm-wise, ||ff - torch|| / ||torch||;

each against 2 depth gamma_K (docs/testing.md), K the longest sum (the
step's rows, 4C or V), depth 4L + 4 plus 2 per MoE block (the router's sum
over C and each gate's gradient). Exit status 1 if anything differs."""
import json
import math
import os
import sys
from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch as gt  # noqa: E402
import moe_oracle as mo  # noqa: E402

MAGIC_MOE, VERSION_MOE = 20261125, 1
NAMES = gt.PARAM_NAMES + ["routerw", "efcw", "efcb", "efcprojw", "efcprojb"]


def is_moe(cfg, l):
    return (l + 1) % cfg["every"] == 0


def shapes(cfg):
    L, C, E = cfg["L"], cfg["C"], cfg["E"]
    Lm = sum(is_moe(cfg, l) for l in range(L))
    Ld = L - Lm
    s = gt.param_shapes(cfg)
    s.update({"fcw": (Ld, 4 * C, C), "fcb": (Ld, 4 * C), "fcprojw": (Ld, C, 4 * C),
              "fcprojb": (Ld, C)})
    s.update({"routerw": (Lm, E, C), "efcw": (Lm, E, 4 * C, C), "efcb": (Lm, E, 4 * C),
              "efcprojw": (Lm, E, C, 4 * C), "efcprojb": (Lm, E, C)})
    return {n: s[n] for n in NAMES}


def read_moe(path):
    raw = open(path, "rb").read()
    hdr = np.frombuffer(raw, dtype="<i4", count=256)
    if hdr[0] != MAGIC_MOE or hdr[1] != VERSION_MOE:
        raise ValueError(f"{path}: not a fourfold MoE v1 checkpoint (magic {hdr[0]})")
    cfg = dict(zip(gt.CFG_KEYS, (int(x) for x in hdr[2:8])))
    cfg.update(E=int(hdr[8]), every=int(hdr[9]), k=int(hdr[10]))
    cfg["factor"] = float(np.frombuffer(hdr[11:12].tobytes(), dtype="<f4")[0])
    cfg["coef"] = float(np.frombuffer(hdr[12:13].tobytes(), dtype="<f4")[0])
    sh = shapes(cfg)
    n = sum(int(np.prod(v)) for v in sh.values())
    if len(raw) != 1024 + 4 * n:
        raise ValueError(f"{path}: {len(raw)} bytes, the header implies {1024 + 4 * n}")
    data = np.frombuffer(raw, dtype="<f4", count=n, offset=1024)
    out, off = {}, 0
    for name, shape in sh.items():
        k = int(np.prod(shape))
        out[name] = data[off:off + k].reshape(shape).astype(np.float64)
        off += k
    return cfg, out


def routing(cfg, l, T, x, wr, probs, ff_choice):
    """Each token's k choices (m, k) by exact arithmetic, ties to the lower
    index, except where fourfold's float32 routing may order two experts
    otherwise: there fourfold's (ff_choice, raw experts) is adopted, so that
    the values compare at the same routing. Fourfold may order experts a and
    b otherwise only if |p_a - p_b| <= (p_a + p_b) (2 dz + rho) (docs/moe.md,
    "Routing across grids", one run against exact arithmetic): the logits
    z_e = <x_t, Wr_e> come out of depth reductions in sequence (10 in block
    l, 11 per earlier block, 12 for an MoE one), each carried to first
    order, so |dz_e| <= depth gamma_K ||x_t|| ||Wr_e||, K = max(4C, T) + 8;
    the softmax moves p_e by at most 2 p_e dz and rounds it by rho =
    gamma_(E+3) + u ln(p_max / p_e). Returns the choices and (gaps, the
    tokens within a bound of a tie, those adopted, those fourfold routed
    otherwise beyond the bound), gaps the (p_j - p_j+1, its bound) of each
    token's j-th and (j + 1)-th best, j < k."""
    u = 2.0**-24
    E, k, C = cfg["E"], cfg["k"], cfg["C"]
    depth = 10 + sum(11 + is_moe(cfg, b) for b in range(l))
    K = max(4 * C, T) + 8
    gam = K * u / (1 - K * u)
    rho0 = (E + 3) * u / (1 - (E + 3) * u)
    xn = torch.linalg.norm(x, dim=1).numpy()
    wn = float(torch.linalg.norm(wr, dim=1).max())
    p = probs.detach().numpy()
    choice = np.zeros((p.shape[0], k), dtype=np.int64)
    gaps, near, adopted, wrong = [], 0, 0, []
    for i in range(p.shape[0]):
        order = sorted(range(E), key=lambda e: (-p[i, e], e))
        dz = depth * gam * xn[i] * wn

        def bound(a, b):
            rho = rho0 + u * math.log(p[i, order[0]] / min(p[i, a], p[i, b]))
            return (p[i, a] + p[i, b]) * (2 * dz + rho)

        row = [(p[i, order[j]] - p[i, order[j + 1]], bound(order[j], order[j + 1]))
               for j in range(min(k, E - 1))]
        gaps += row
        near += any(g <= bd for g, bd in row)
        choice[i] = order[:k]
        mine = list(ff_choice[i])
        if mine != order[:k]:
            if all(a == b or abs(p[i, a] - p[i, b]) <= bound(a, b)
                   for a, b in zip(mine, order[:k])) and len(set(mine)) == k:
                choice[i] = mine
                adopted += 1
            else:
                wrong.append((i, mine, order[:k], row))
    return choice, (gaps, near, adopted, wrong)


def moe_layer(cfg, l, x, wr, w1, b1, w2, b2, T, ff_route):
    """x (m, C) -> (y (m, C), aux, kept assignments, assignments, the
    routing: (choice (m, k) as fourfold encodes it, ~e where dropped;
    routing()'s statistics)), fourfold's routing ff_route (same encoding)
    adopted at near ties (routing())."""
    E, k = cfg["E"], cfg["k"]
    m = x.shape[0]
    probs = torch.softmax(x @ wr.t(), dim=1)
    # the factor as the float fourfold holds; a product within 4 float
    # epsilons above an integer counts as that integer, as fourfold's does
    fkt = Fraction(cfg["factor"]) * k * T / E
    cap = math.ceil(fkt - fkt * Fraction(4, 2**23))
    ff_raw = np.where(ff_route < 0, ~ff_route, ff_route)
    choice, stats = routing(cfg, l, T, x.detach(), wr.detach(), probs, ff_raw)
    kept = mo.place(choice, E, T, cap)
    sel = probs.gather(1, torch.tensor(choice))
    gates = sel if k == 1 else sel / sel.sum(dim=1, keepdim=True)
    rows = []
    for i in range(m):
        acc = torch.zeros(x.shape[1], dtype=x.dtype)
        for j in range(k):
            if kept[i, j]:
                e = choice[i, j]
                h = F.gelu(x[i] @ w1[e].t() + b1[e], approximate="tanh")
                acc = acc + gates[i, j] * (h @ w2[e].t() + b2[e])
        rows.append(acc)
    f = torch.tensor([(choice[:, 0] == e).mean() for e in range(E)], dtype=x.dtype)
    aux = cfg["coef"] * E * (f * probs.mean(dim=0)).sum()
    enc = np.where(kept, choice, ~choice)
    return torch.stack(rows), aux, int(kept.sum()), m * k, (enc, stats)


def forward(cfg, P, tokens, targets, ff_route):
    """The mean cross-entropy and the summed load-balancing loss of one
    micro-batch; kept and total assignments; each MoE block's routing
    (moe_layer; ff_route: fourfold's, (MoE blocks, B T, k))."""
    L, NH, C, V = cfg["L"], cfg["NH"], cfg["C"], cfg["V"]
    B, T = tokens.shape
    hs = C // NH
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = P["wte"][tokens] + P["wpe"][:T].unsqueeze(0)
    aux_sum, kept, total, d, mo, routes = 0.0, 0, 0, 0, 0, []
    for l in range(L):
        h = gt._layernorm(x, P["ln1w"][l], P["ln1b"][l])
        qkv = h @ P["qkvw"][l].t() + P["qkvb"][l]
        q, kk, v = (t.reshape(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = (q @ kk.transpose(-1, -2)) / math.sqrt(hs)
        att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ P["attprojw"][l].t() + P["attprojb"][l])
        h = gt._layernorm(x, P["ln2w"][l], P["ln2b"][l])
        if is_moe(cfg, l):
            out, aux, kp, tot, rt = moe_layer(cfg, l, h.reshape(B * T, C), P["routerw"][mo],
                                              P["efcw"][mo], P["efcb"][mo], P["efcprojw"][mo],
                                              P["efcprojb"][mo], T, ff_route[mo])
            routes.append(rt)
            x = x + out.reshape(B, T, C)
            aux_sum, kept, total, mo = aux_sum + aux, kept + kp, total + tot, mo + 1
        else:
            h = F.gelu(h @ P["fcw"][d].t() + P["fcb"][d], approximate="tanh")
            x = x + (h @ P["fcprojw"][d].t() + P["fcprojb"][d])
            d += 1
    x = gt._layernorm(x, P["lnfw"], P["lnfb"])
    logits = x @ P["wte"].t()
    ce = F.cross_entropy(logits[..., :V].reshape(B * T, V), targets.reshape(B * T))
    return ce, aux_sum, kept, total, routes


def main():
    d = sys.argv[1]
    cfg, params = read_moe(os.path.join(d, "model.bin"))
    _, ffg = read_moe(os.path.join(d, "ff_grads.bin"))
    ff = json.load(open(os.path.join(d, "ff.json")))
    tokens, targets = gt.read_batch(os.path.join(d, "batch.bin"))
    M, B, T = ff["micro"], ff["B"], ff["T"]
    P = {n: torch.tensor(a, requires_grad=True) for n, a in params.items()}
    L, k = cfg["L"], cfg["k"]
    Lm = sum(is_moe(cfg, l) for l in range(L))
    # fourfold's routing of each token (ff_gpt_moe_routing: e, or ~e dropped)
    ff_route = np.fromfile(os.path.join(d, "ff_route.bin"), dtype="<i4")
    ff_route = ff_route.reshape(Lm, M, B * T, k)
    ce_sum, aux_sum, kept, total, routes = 0.0, 0.0, 0, 0, []
    for u in range(M):
        sl = slice(u * B, (u + 1) * B)
        ce, aux, kp, tot, rt = forward(cfg, P, torch.tensor(tokens[sl]),
                                       torch.tensor(targets[sl]), ff_route[:, u])
        ce_sum, aux_sum, kept, total = ce_sum + ce, aux_sum + aux, kept + kp, total + tot
        routes.append(rt)
    loss = (ce_sum + aux_sum) / M
    loss.backward()
    u = 2.0**-24
    K = max(M * B * T, 4 * cfg["C"], cfg["V"])
    bound = 2 * (4 * L + 4 + 2 * Lm) * (K * u / (1 - K * u))
    failures = 0
    # the routing, token by token: exact arithmetic's, but where fourfold's
    # rounding may order two experts otherwise (then fourfold's, adopted):
    # every choice, and which assignments capacity dropped, equal exactly
    near, adopted, differ, gaps = 0, 0, 0, []
    for mo in range(Lm):
        for u in range(M):
            enc, (g, nr, ad, wrong) = routes[u][mo]
            gaps, near, adopted = gaps + g, near + nr, adopted + ad
            for i, mine, exact, row in wrong:
                print(f"MoE block {mo}, micro-batch {u}, token {i}: fourfold chose {mine}, "
                      f"exact arithmetic {exact}, beyond the rounding's bound (margins/bounds "
                      f"{', '.join(f'{a:.2e}/{b:.2e}' for a, b in row)})")
            failures += len(wrong)
            bad = np.flatnonzero((ff_route[mo, u] != enc).any(axis=1))
            for i in bad[:5]:
                print(f"MoE block {mo}, micro-batch {u}, token {i}: fourfold "
                      f"{ff_route[mo, u, i].tolist()}, PyTorch {enc[i].tolist()} (~e: dropped)")
            differ += len(bad)
    failures += differ > 0
    min_gap = min(a for a, _ in gaps)
    min_ratio = min(a / b for a, b in gaps)
    dropped = 1 - kept / total
    if not dropped > 0:
        print("no assignment dropped: the batch does not test the capacity")
        failures += 1
    if abs(dropped - ff["dropped"]) > 1e-6:  # ff.json holds a float: 1e-6 > its rounding
        print(f"dropped: fourfold {ff['dropped']}, PyTorch {dropped}")
        failures += 1
    line = [f"routing of {M * B * T * Lm} tokens {'equal' if not differ else 'DIFFERS'} "
            f"(smallest margin {min_gap:.2e}, {min_ratio:.2f} x its bound; {near} within "
            f"their bound, {adopted} of them routed otherwise by fourfold)",
            f"dropped {dropped:.4f} (equal)"]
    for name, mine, ref in (("loss", ff["loss"], float(ce_sum) / M),
                            ("aux", ff["aux"], float(aux_sum) / M)):
        err = abs(mine - ref) / abs(ref)
        line.append(f"{name} {err:.1e}")
        if not err <= bound:
            print(f"{name}: fourfold {mine:.9g}, PyTorch {ref:.9g} (rel {err:.2e} > {bound:.2e})")
            failures += 1
    for name in NAMES:
        ref = P[name].grad.numpy().ravel()
        if ref.size == 0:
            continue
        mine = ffg[name].ravel()
        if name == "wte":  # the padded rows have no gradient in either
            ref = ref[:cfg["V"] * cfg["C"]]
            mine = mine[:cfg["V"] * cfg["C"]]
        err = np.linalg.norm(mine - ref) / max(np.linalg.norm(ref), 1e-300)
        line.append(f"{name} {err:.1e}")
        if not err <= bound:
            print(f"gradient {name}: relative error {err:.3e} > bound {bound:.3e}")
            failures += 1
    print(f"MoE GPT L={L} ({Lm} MoE) C={cfg['C']} E={cfg['E']} top-{cfg['k']} factor "
          f"{cfg['factor']:g} coef {cfg['coef']:g}, {M} micro-batches of {B}x{T}; bound "
          f"{bound:.2e}: " + ", ".join(line))
    print(f"gpt_moe_oracle: {'FAILED' if failures else 'passed'} ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
