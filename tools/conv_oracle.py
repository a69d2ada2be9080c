#!/usr/bin/env python3
"""The serial convolution layer (src/nn/conv.c) against PyTorch's conv2d in
float64.

Reads the cases `test_conv --dump DIR` writes (conv_<i>.bin: an int32 header
B, H, W, Cin, Cout, k, stride, bias; then float32 X (B,H,W,Cin) in NHWC,
W (Cout,Cin,k,k) in PyTorch's layout, b (Cout), dO (B,Ho,Wo,Cout), and
fourfold's output, input gradient, weight gradient and bias gradient),
recomputes each with torch.nn.functional.conv2d (padding k // 2) and
autograd in float64, and compares every element against its bound
(docs/testing.md, "The bounds of the convolution tests"):

  |fourfold - torch| <= (gamma_K(u32) + gamma_K(u64)) * sum|terms|

sum|terms| the same convolution of the absolute values (conv2d(|X|, |W|) +
|b|, and its gradients at |dO|), K the longest chain of roundings a term
passes through in fourfold's float32 sum: output 9 Cin + 2 (Cin for 1x1),
input gradient Cout + 1 + 9 (Cout + 1 for 1x1), weight and bias gradients
P + 2, P the output pixels of the batch.

Exit status 1 if anything is outside its bound or a file is malformed."""
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
U32, U64 = 2.0 ** -24, 2.0 ** -53


def gamma(k, u):
    return k * u / (1 - k * u)


def read(path):
    raw = open(path, "rb").read()
    B, H, W, Cin, Cout, k, s, bias = struct.unpack_from("<8i", raw, 0)
    if k not in (1, 3) or s not in (1, 2):
        raise ValueError(f"{path}: kernel {k}, stride {s}")
    p = k // 2
    Ho, Wo = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    off = 32
    sizes = dict(X=B * H * W * Cin, Wt=Cout * Cin * k * k, b=Cout, dO=B * Ho * Wo * Cout)
    c = dict(B=B, H=H, W=W, Cin=Cin, Cout=Cout, k=k, s=s, bias=bias, Ho=Ho, Wo=Wo)
    for name, n in list(sizes.items()) + [("out", sizes["dO"]), ("dX", sizes["X"]),
                                          ("dW", sizes["Wt"]), ("db", Cout)]:
        c[name] = np.frombuffer(raw, dtype="<f4", count=n, offset=off).astype(np.float64)
        off += 4 * n
    if off != len(raw):
        raise ValueError(f"{path}: {len(raw) - off} bytes left over")
    return c


def nchw(a, B, H, W, C):
    return torch.tensor(a.reshape(B, H, W, C)).permute(0, 3, 1, 2).contiguous()


def conv_grads(x, w, b, dO, s, p):
    """out, dX, dW, db of out = conv2d(x, w, b) at the output gradient dO"""
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    out = F.conv2d(x, w, b, stride=s, padding=p)
    (out * dO).sum().backward()
    return out.detach(), x.grad, w.grad, b.grad


def main(paths):
    bad = 0
    for path in paths:
        c = read(path)
        B, H, W, Cin, Cout, k, s = (c[n] for n in ("B", "H", "W", "Cin", "Cout", "k", "s"))
        Ho, Wo, p = c["Ho"], c["Wo"], k // 2
        x = nchw(c["X"], B, H, W, Cin)
        w = torch.tensor(c["Wt"].reshape(Cout, Cin, k, k))
        b = torch.tensor(c["b"])
        dO = nchw(c["dO"], B, Ho, Wo, Cout)
        ref = conv_grads(x, w, b, dO, s, p)
        mag = conv_grads(x.abs(), w.abs(), b.abs(), dO.abs(), s, p)
        taps = 9 if k == 3 else 0
        P = B * Ho * Wo
        K = dict(out=Cin * k * k + 2, dX=Cout + 1 + taps, dW=P + 2, db=P + 2)
        got = dict(out=nchw(c["out"], B, Ho, Wo, Cout), dX=nchw(c["dX"], B, H, W, Cin),
                   dW=torch.tensor(c["dW"].reshape(Cout, Cin, k, k)), db=torch.tensor(c["db"]))
        for i, name in enumerate(("out", "dX", "dW", "db")):
            if name == "db" and not c["bias"]:
                continue
            bound = (gamma(K[name], U32) + gamma(K[name], U64)) * mag[i]
            if name == "db":
                bound = (gamma(K[name], U32) + gamma(K[name], U64)) * dO.abs().sum((0, 2, 3))
            err = (got[name] - ref[i]).abs()
            ok = bool(torch.isfinite(got[name]).all()) and bool((err <= bound).all())
            ratio = float((err / bound.clamp_min(1e-300)).max())
            print(f"{path}: {k}x{k} stride {s}, {B}x{H}x{W}x{Cin} -> {Cout}: {name:3s} "
                  f"worst |err|/bound {ratio:.3f} (K = {K[name]})  {'ok' if ok else 'FAILED'}")
            bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
