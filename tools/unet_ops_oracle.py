#!/usr/bin/env python3
"""The U-Net's serial operations (src/nn/unet_ops.c) against PyTorch in
float64: torch.nn.functional.group_norm, silu, interpolate (nearest, scale
2) and avg_pool2d (2), with autograd.

Reads what `test_unet_ops --dump DIR` writes (gn_<i>.bin: int32 B, H, W, C,
G, float32 eps, then float32 x, w, b, dout and fourfold's out, dx, dw, db;
local.bin: int32 B, H, W, C, then x, the up-sampling's and down-sampling's
output gradients, and fourfold's SiLU, its gradient at dout = x, the
up-sampling, its gradient, the down-sampling and its gradient; all NHWC) and
compares against the bounds of docs/testing.md ("The bounds of the U-Net's
operations"):

- GroupNorm norm-wise per tensor: out 2, dx 3, dw 3, db 1 stages of
  gamma_{K+8}, K = max(H W C/G, B H W) + 1;
- SiLU element by element: |err| <= gamma_8 |y|; its gradient
  |err| <= gamma_12 |dout| s (1 + |x| (1 - s));
- up-sampling: the output exactly (copies), its gradient within
  gamma_3 (sum of the four |terms|); down-sampling: the output within
  gamma_3 / 4 (sum of the four |x|), its gradient exactly (dout / 4).

Exit status 1 if anything is outside its bound or a file is malformed."""
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
U = 2.0 ** -24


def gamma(k):
    return k * U / (1 - k * U)


class Reader:
    def __init__(self, path):
        self.path, self.raw, self.off = path, open(path, "rb").read(), 0

    def ints(self, n):
        v = struct.unpack_from(f"<{n}i", self.raw, self.off)
        self.off += 4 * n
        return v

    def floats(self, n):
        a = np.frombuffer(self.raw, dtype="<f4", count=n, offset=self.off).astype(np.float64)
        self.off += 4 * n
        return torch.tensor(a)

    def done(self):
        if self.off != len(self.raw):
            raise ValueError(f"{self.path}: {len(self.raw) - self.off} bytes left over")


def nchw(a, B, H, W, C):
    return a.reshape(B, H, W, C).permute(0, 3, 1, 2)


def report(path, name, ratio, ok):
    print(f"{path}: {name:26s} worst error/bound {ratio:.3f}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def normwise(path, name, got, ref, bound):
    err = float((got - ref).norm() / ref.norm())
    ok = bool(torch.isfinite(got).all()) and err <= bound
    return report(path, name, err / bound, ok)


def elementwise(path, name, got, ref, bound):
    err = (got - ref).abs()
    ok = bool(torch.isfinite(got).all()) and bool((err <= bound).all())
    ratio = float((err / bound.clamp_min(1e-300)).max()) if bool((bound > 0).any()) else 0.0
    if bool(((bound == 0) & (err > 0)).any()):
        ratio, ok = float("inf"), False
    return report(path, name, ratio, ok)


def groupnorm(path):
    r = Reader(path)
    B, H, W, C, G = r.ints(5)
    eps = float(np.frombuffer(r.raw, dtype="<f4", count=1, offset=r.off)[0])
    r.off += 4
    n = B * H * W * C
    x, w, b, dout = r.floats(n), r.floats(C), r.floats(C), r.floats(n)
    out, dx, dw, db = r.floats(n), r.floats(n), r.floats(C), r.floats(C)
    r.done()
    xt = nchw(x, B, H, W, C).clone().requires_grad_(True)
    wt, bt = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    y = F.group_norm(xt, G, wt, bt, eps=eps)
    (y * nchw(dout, B, H, W, C)).sum().backward()
    K = max(H * W * C // G, B * H * W) + 1 + 8
    bad = normwise(path, f"GroupNorm({G}) output", nchw(out, B, H, W, C), y.detach(), 2 * gamma(K))
    bad += normwise(path, "GroupNorm input gradient", nchw(dx, B, H, W, C), xt.grad, 3 * gamma(K))
    bad += normwise(path, "GroupNorm weight gradient", dw, wt.grad, 3 * gamma(K))
    bad += normwise(path, "GroupNorm bias gradient", db, bt.grad, gamma(K))
    return bad


def local(path):
    r = Reader(path)
    B, H, W, C = r.ints(4)
    n = B * H * W * C
    x, dup, ddown = r.floats(n), r.floats(4 * n), r.floats(n // 4)
    silu, dsilu, up, dxup, down, dxdown = (r.floats(k) for k in (n, n, 4 * n, n, n // 4, n))
    r.done()
    bad = 0
    xt = x.clone().requires_grad_(True)
    y = F.silu(xt)
    (y * x).sum().backward()
    s = torch.sigmoid(x)
    bad += elementwise(path, "SiLU output", silu, y.detach(), gamma(8) * y.detach().abs())
    bad += elementwise(path, "SiLU gradient", dsilu, xt.grad,
                       gamma(12) * (x.abs() * s * (1 + x.abs() * (1 - s))))
    xt = nchw(x, B, H, W, C).clone().requires_grad_(True)
    u = F.interpolate(xt, scale_factor=2, mode="nearest")
    g = nchw(dup, B, 2 * H, 2 * W, C)
    (u * g).sum().backward()
    bad += elementwise(path, "up-sampling output", nchw(up, B, 2 * H, 2 * W, C), u.detach(),
                       torch.zeros_like(u))
    bound = gamma(3) * F.avg_pool2d(g.abs(), 2) * 4
    bad += elementwise(path, "up-sampling gradient", nchw(dxup, B, H, W, C), xt.grad, bound)
    xt = nchw(x, B, H, W, C).clone().requires_grad_(True)
    d = F.avg_pool2d(xt, 2)
    (d * nchw(ddown, B, H // 2, W // 2, C)).sum().backward()
    bound = gamma(3) * F.avg_pool2d(xt.detach().abs(), 2)
    bad += elementwise(path, "down-sampling output", nchw(down, B, H // 2, W // 2, C), d.detach(),
                       bound)
    bad += elementwise(path, "down-sampling gradient", nchw(dxdown, B, H, W, C), xt.grad,
                       torch.zeros_like(xt))
    return bad


def main(paths):
    bad = 0
    for p in paths:
        bad += local(p) if p.endswith("local.bin") else groupnorm(p)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
