#!/usr/bin/python3
"""The serial mixture-of-experts GPT against PyTorch in float64 (run with
/usr/bin/python3).

  gpt_moe_oracle.py DIR

DIR holds what `test_gpt --dump-moe DIR` writes: model.bin (fourfold's MoE
checkpoint format, docs/moe.md), batch.bin (two micro-batches), ff_grads.bin
(the gradients of one step over them, the same layout) and ff.json (the
step's loss, load-balancing loss and fraction of assignments dropped).

The model is rebuilt from the checkpoint with torch operations, written out
from the definition in docs/moe.md and independently of fourfold's code:
dense blocks as GPT-2 (tools/gpt_torch.py), MoE blocks with a router
softmax(x Wr^T), top-k choices (ties to the lower index), capacity
ceil(F k T / E) per expert and sequence (first choices before second ones,
in position order), gates (top-2 renormalised), experts GELU MLPs, and the
Switch Transformer's load-balancing loss coef E sum_e f_e P_e over each
micro-batch. The step's loss is the mean over the micro-batches of the
cross-entropy plus the load-balancing losses. Compared:

- the fraction dropped (the same assignments: exactly);
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


def moe_layer(cfg, x, wr, w1, b1, w2, b2, T):
    """x (m, C) -> (y (m, C), aux, kept assignments, assignments)."""
    E, k = cfg["E"], cfg["k"]
    m = x.shape[0]
    probs = torch.softmax(x @ wr.t(), dim=1)
    # the factor as the float fourfold holds; a product within 4 float
    # epsilons above an integer counts as that integer, as fourfold's does
    fkt = Fraction(cfg["factor"]) * k * T / E
    cap = math.ceil(fkt - fkt * Fraction(4, 2**23))
    choice, kept = mo.assignments(probs.detach().numpy(), k, T, cap)
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
    return torch.stack(rows), aux, int(kept.sum()), m * k


def forward(cfg, P, tokens, targets):
    """The mean cross-entropy and the summed load-balancing loss of one
    micro-batch; kept and total assignments."""
    L, NH, C, V = cfg["L"], cfg["NH"], cfg["C"], cfg["V"]
    B, T = tokens.shape
    hs = C // NH
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = P["wte"][tokens] + P["wpe"][:T].unsqueeze(0)
    aux_sum, kept, total, d, mo = 0.0, 0, 0, 0, 0
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
            out, aux, kp, tot = moe_layer(cfg, h.reshape(B * T, C), P["routerw"][mo],
                                          P["efcw"][mo], P["efcb"][mo], P["efcprojw"][mo],
                                          P["efcprojb"][mo], T)
            x = x + out.reshape(B, T, C)
            aux_sum, kept, total, mo = aux_sum + aux, kept + kp, total + tot, mo + 1
        else:
            h = F.gelu(h @ P["fcw"][d].t() + P["fcb"][d], approximate="tanh")
            x = x + (h @ P["fcprojw"][d].t() + P["fcprojb"][d])
            d += 1
    x = gt._layernorm(x, P["lnfw"], P["lnfb"])
    logits = x @ P["wte"].t()
    ce = F.cross_entropy(logits[..., :V].reshape(B * T, V), targets.reshape(B * T))
    return ce, aux_sum, kept, total


def main():
    d = sys.argv[1]
    cfg, params = read_moe(os.path.join(d, "model.bin"))
    _, ffg = read_moe(os.path.join(d, "ff_grads.bin"))
    ff = json.load(open(os.path.join(d, "ff.json")))
    tokens, targets = gt.read_batch(os.path.join(d, "batch.bin"))
    M, B, T = ff["micro"], ff["B"], ff["T"]
    P = {n: torch.tensor(a, requires_grad=True) for n, a in params.items()}
    ce_sum, aux_sum, kept, total = 0.0, 0.0, 0, 0
    for u in range(M):
        sl = slice(u * B, (u + 1) * B)
        ce, aux, kp, tot = forward(cfg, P, torch.tensor(tokens[sl]), torch.tensor(targets[sl]))
        ce_sum, aux_sum, kept, total = ce_sum + ce, aux_sum + aux, kept + kp, total + tot
    loss = (ce_sum + aux_sum) / M
    loss.backward()
    u = 2.0**-24
    L = cfg["L"]
    Lm = sum(is_moe(cfg, l) for l in range(L))
    K = max(M * B * T, 4 * cfg["C"], cfg["V"])
    bound = 2 * (4 * L + 4 + 2 * Lm) * (K * u / (1 - K * u))
    failures = 0
    dropped = 1 - kept / total
    if abs(dropped - ff["dropped"]) > 1e-6:  # ff.json holds a float: 1e-6 > its rounding
        print(f"dropped: fourfold {ff['dropped']}, PyTorch {dropped}")
        failures += 1
    line = [f"dropped {dropped:.4f} (equal)"]
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
