#!/usr/bin/env python3
"""The serial MoE layer (src/nn/moe.c) against PyTorch in float64.

Reads the cases tests/test_moe.c --dump writes (moe_<i>.bin: the shape, the
input, the parameters, an output gradient, and fourfold's output, load-
balancing loss, dropped fraction, assignments, input and parameter
gradients), recomputes each in float64 from the layer's definition
(docs/moe.md) with autograd, and compares:

- the routing: PyTorch's own top-k choices and capacity (first choices
  before second ones, per sequence, in position order) give exactly
  fourfold's assignments and dropped fraction;
- the output, the loss and every gradient (of sum(y * dy) + aux) norm-wise
  against 2 (depth) gamma_K, the bound of docs/testing.md for float32 sums
  of at most K terms (K the widest inner dimension), depth 4 (router,
  first layer, GELU, second layer).

Exit status 1 if anything differs."""
import math
import struct
from fractions import Fraction
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)


def read(path):
    raw = open(path, "rb").read()
    C, H, E, k, T, m = struct.unpack_from("<6i", raw, 0)
    factor, coef = struct.unpack_from("<2d", raw, 24)
    off = 40
    sizes = [C * E, E * C * H, E * H, E * H * C, E * C]
    npar = sum(sizes)

    def take(n, dt, size):
        nonlocal off
        a = np.frombuffer(raw, dtype=dt, count=n, offset=off)
        off += n * size
        return a

    case = dict(C=C, H=H, E=E, k=k, T=T, m=m, factor=factor, coef=coef)
    case["x"] = take(m * C, "<f4", 4)
    par = take(npar, "<f4", 4)
    case["dy"] = take(m * C, "<f4", 4)
    case["y"] = take(m * C, "<f4", 4)
    case["aux"] = take(1, "<f4", 4)[0]
    case["dropped"] = take(1, "<f8", 8)[0]
    case["choice"] = take(m * k, "<i4", 4).reshape(m, k)
    case["dx"] = take(m * C, "<f4", 4)
    grad = take(npar, "<f4", 4)
    assert off == len(raw), f"{path}: {len(raw) - off} bytes left over"
    names = ["wr", "w1", "b1", "w2", "b2"]
    at = 0
    for name, n in zip(names, sizes):
        case[name] = par[at:at + n]
        case["g" + name] = grad[at:at + n]
        at += n
    return case


def assignments(p, k, T, cap):
    """Each token's k choices, the largest probabilities of p (m, E) with
    ties to the lower index, and which are kept: capacity cap per expert and
    sequence of T tokens, first choices before second ones, each in position
    order. Returns (choice (m, k), kept (m, k) bool)."""
    m, E = p.shape
    choice = np.array([sorted(range(E), key=lambda e: (-p[i, e], e))[:k] for i in range(m)])
    return choice, place(choice, E, T, cap)


def place(choice, E, T, cap):
    """Which of the assignments choice (m, k) are kept: capacity cap per
    expert and sequence of T tokens, first choices before second ones, each
    in position order."""
    m, k = choice.shape
    kept = np.zeros((m, k), dtype=bool)
    for q in range(0, m, T):
        count = [0] * E
        for j in range(k):
            for i in range(q, q + T):
                e = choice[i, j]
                if count[e] < cap:
                    kept[i, j] = True
                    count[e] += 1
    return kept


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def oracle(c):
    C, H, E, k, T, m = c["C"], c["H"], c["E"], c["k"], c["T"], c["m"]
    t = lambda a, *shape: torch.tensor(np.asarray(a, dtype=np.float64).reshape(*shape),
                                       requires_grad=True)
    x = t(c["x"], m, C)
    wr = t(c["wr"], C, E)
    w1 = t(c["w1"], E, C, H)
    b1 = t(c["b1"], E, H)
    w2 = t(c["w2"], E, H, C)
    b2 = t(c["b2"], E, C)
    probs = torch.softmax(x @ wr, dim=1)
    # exact arithmetic on the factor as written (fourfold rounds F k T / E
    # up, treating a rounding above an integer as that integer)
    cap = math.ceil(Fraction(repr(c["factor"])) * k * T / E)
    choice, kept = assignments(probs.detach().numpy(), k, T, cap)
    if k == 1:
        gates = probs.gather(1, torch.tensor(choice))
    else:
        sel = probs.gather(1, torch.tensor(choice))
        gates = sel / sel.sum(dim=1, keepdim=True)
    y = torch.zeros(m, C)
    rows = []
    for i in range(m):
        acc = torch.zeros(C)
        for j in range(k):
            if kept[i, j]:
                e = choice[i, j]
                o = gelu(x[i] @ w1[e] + b1[e]) @ w2[e] + b2[e]
                acc = acc + gates[i, j] * o
        rows.append(acc)
    y = torch.stack(rows)
    f = torch.tensor([(choice[:, 0] == e).mean() for e in range(E)])
    aux = c["coef"] * E * (f * probs.mean(dim=0)).sum()
    loss = (y * torch.tensor(np.asarray(c["dy"], dtype=np.float64).reshape(m, C))).sum() + aux
    loss.backward()
    want_choice = np.where(kept, choice, -1)
    dropped = 1 - kept.mean()
    return dict(y=y.detach().numpy().ravel(), aux=aux.item(), dx=x.grad.numpy().ravel(),
                gwr=wr.grad.numpy().ravel(), gw1=w1.grad.numpy().ravel(),
                gb1=b1.grad.numpy().ravel(), gw2=w2.grad.numpy().ravel(),
                gb2=b2.grad.numpy().ravel(), choice=want_choice, dropped=dropped)


def main():
    u = 2.0**-24
    failures = 0
    for path in sys.argv[1:]:
        c = read(path)
        o = oracle(c)
        K = max(c["C"], c["H"], c["m"])
        bound = 2 * 4 * (K * u / (1 - K * u))
        if not np.array_equal(o["choice"], c["choice"]):
            print(f"{path}: assignments differ:\nfourfold {c['choice'].tolist()}\n"
                  f"pytorch  {o['choice'].tolist()}")
            failures += 1
        if abs(o["dropped"] - c["dropped"]) > 1e-12:
            print(f"{path}: dropped {c['dropped']}, PyTorch {o['dropped']}")
            failures += 1
        line = []
        for name in ("y", "dx", "gwr", "gw1", "gb1", "gw2", "gb2"):
            ref = o[name]
            err = np.linalg.norm(c[name].astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-300)
            line.append(f"{name} {err:.1e}")
            if not err <= bound:
                print(f"{path}: {name} relative error {err:.3e} > bound {bound:.3e}")
                failures += 1
        aerr = abs(c["aux"] - o["aux"]) / max(abs(o["aux"]), 1e-300)
        line.append(f"aux {aerr:.1e}")
        if not aerr <= bound:
            print(f"{path}: aux {c['aux']} against {o['aux']}")
            failures += 1
        print(f"{path}: top-{c['k']} factor {c['factor']:g}, dropped {c['dropped']:.3f}; "
              f"bound {bound:.1e}: " + ", ".join(line))
    print(f"moe_oracle: {'FAILED' if failures else 'passed'} ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
