#!/usr/bin/python3
"""The serial DDPM U-Net (src/nn/unet.c, src/nn/unet_ddpm.c) against an
independent PyTorch model in float64 (run with /usr/bin/python3).

  unet_oracle.py unet.bin     (written by `test_unet --dump DIR`)

The model here is written from the description of include/fourfold/unet.h
and Ho et al. / improved DDPM, not from fourfold's code: NCHW tensors,
torch.cat for the skip concatenations (one convolution and one GroupNorm
over the concatenated channels, where fourfold sums convolutions over the
parts), F.conv2d, F.group_norm (groups of group_channels channels),
F.silu, F.interpolate (nearest), F.avg_pool2d, F.linear, improved DDPM's
timestep_embedding, the linear (or cosine) schedule from its betas, and
autograd. The images' padding channels are zeros into conv_in, and only
the data's channels of conv_out enter the loss.

Compared (docs/testing.md, "The bounds of the U-Net"): the loss within
(F + 1) gamma_{K+8} of its value, every gradient tensor norm-wise within
(2F + 1) gamma_{K+8} of its norm, F = 6 per residual block + 8 (+ 7 for the attention block: GroupNorm 2,
QKV, scores, softmax, P V, projection), K the
batch's pixels (the longest reduction); and the parameters after one AdamW
step on fourfold's gradients, torch.optim.AdamW's, element by element; the
cosine and linear schedules' alpha_bar at T = 1000 within 1e-12; one
reverse step of the sampler (T = 1) from fourfold's x_T.
Exit status 1 on a failure."""
import math
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
        return list(v)

    def doubles(self, n):
        v = struct.unpack_from(f"<{n}d", self.raw, self.off)
        self.off += 8 * n
        return list(v)

    def floats(self, n):
        a = np.frombuffer(self.raw, dtype="<f4", count=n, offset=self.off).astype(np.float64)
        self.off += 4 * n
        return torch.tensor(a)

    def text(self, n):
        s = self.raw[self.off:self.off + n].decode()
        self.off += n
        return s

    def done(self):
        if self.off != len(self.raw):
            raise ValueError(f"{self.path}: {len(self.raw) - self.off} bytes left over")


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
    a = t[:, None].double() * freqs[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=1)


def alpha_bar(T, schedule, b0, b1):
    if schedule == 0:
        betas = torch.linspace(b0, b1, T) if T > 1 else torch.tensor([b0])
    else:
        s = 0.008
        f = lambda i: math.cos((i / T + s) / (1 + s) * math.pi / 2) ** 2
        betas = torch.tensor([min(1 - f(i + 1) / f(i), 0.999) for i in range(T)])
    return torch.cumprod(1 - betas, 0)


def main(path):
    r = Reader(path)
    S, ci, pad, base, levels = r.ints(5)
    mult = r.ints(levels)
    nres, gch, tmult, T, schedule, B, nt, hch = r.ints(8)
    b0, b1 = r.doubles(2)
    x0 = r.floats(B * S * S * ci).reshape(B, S, S, ci).permute(0, 3, 1, 2)
    t = torch.tensor(r.ints(B))
    noise = r.floats(B * S * S * ci).reshape(B, S, S, ci).permute(0, 3, 1, 2)
    P, G, shapes = {}, {}, {}
    for _ in range(nt):
        (n,) = r.ints(1)
        name = r.text(n)
        (nd,) = r.ints(1)
        shape = r.ints(nd)
        numel = int(np.prod(shape))
        P[name] = r.floats(numel).reshape(shape).requires_grad_(True)
        G[name] = r.floats(numel).reshape(shape)
        shapes[name] = shape
    (ff_loss,) = struct.unpack_from("<f", r.raw, r.off)
    r.off += 4
    after = {name: r.floats(P[name].numel()).reshape(P[name].shape) for name in P}
    (nT,) = r.ints(1)
    ff_abar = torch.tensor(r.doubles(2 * nT)).reshape(2, nT)
    xT = r.floats(B * S * S * ci).reshape(B, S, S, ci).permute(0, 3, 1, 2)
    ff_sample = r.floats(B * S * S * ci).reshape(B, S, S, ci).permute(0, 3, 1, 2)
    r.done()

    used = set()

    def p(name):
        used.add(name)
        return P[name]

    def gn(name, h):
        return F.group_norm(h, h.shape[1] // gch, p(name + ".weight"), p(name + ".bias"), eps=1e-5)

    def conv(name, h, k):
        return F.conv2d(h, p(name + ".weight"), p(name + ".bias"), padding=k // 2)

    def res(name, h, cout, semb):
        y = conv(name + ".conv1", F.silu(gn(name + ".norm1", h)), 3)
        y = y + F.linear(semb, p(name + ".temb.weight"), p(name + ".temb.bias"))[:, :, None, None]
        y = conv(name + ".conv2", F.silu(gn(name + ".norm2", y)), 3)
        skip = conv(name + ".skip", h, 1) if h.shape[1] != cout else h
        return skip + y

    def model(xt, t):
        x = torch.cat([xt, torch.zeros(B, pad - ci, S, S)], dim=1)
        emb = timestep_embedding(t, base)
        emb = F.linear(F.silu(F.linear(emb, p("temb.lin1.weight"), p("temb.lin1.bias"))),
                       p("temb.lin2.weight"), p("temb.lin2.bias"))
        semb = F.silu(emb)
        h = conv("conv_in", x, 3)
        hs = [h]
        for i in range(levels):
            for j in range(nres):
                h = res(f"down{i}.res{j}", h, base * mult[i], semb)
                hs.append(h)
            if i != levels - 1:
                h = F.avg_pool2d(h, 2)
                hs.append(h)
        for j in range(2):
            h = res(f"mid.res{j}", h, base * mult[-1], semb)
            if j == 0 and hch:
                h = attn("mid.attn", h)
        for i in reversed(range(levels)):
            for j in range(nres + 1):
                h = res(f"up{i}.res{j}", torch.cat([h, hs.pop()], dim=1), base * mult[i], semb)
            if i != 0:
                h = F.interpolate(h, scale_factor=2, mode="nearest")
        out = conv("conv_out", F.silu(gn("norm_out", h)), 3)
        return out[:, :ci]

    def attn(name, h):
        # x + proj(softmax(q k^T / sqrt(hs)) v) over the pixels, heads of hch
        Bn, C, H, W = h.shape
        y = gn(name + ".norm", h).reshape(Bn, C, H * W).transpose(1, 2)
        qkv = F.linear(y, p(name + ".qkv.weight"), p(name + ".qkv.bias"))
        q, k, v = (z.reshape(Bn, H * W, C // hch, hch).transpose(1, 2) for z in qkv.chunk(3, -1))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hch), dim=-1)
        o = (a @ v).transpose(1, 2).reshape(Bn, H * W, C)
        o = F.linear(o, p(name + ".proj.weight"), p(name + ".proj.bias"))
        return h + o.transpose(1, 2).reshape(Bn, C, H, W)

    abar = alpha_bar(T, schedule, b0, b1)
    a = abar[t][:, None, None, None]
    xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
    out = model(xt, t)
    loss = ((out - noise) ** 2).mean()
    loss.backward()

    bad = 0
    if used != set(P):
        print(f"FAIL tensors: fourfold's without use here {sorted(set(P) - used)}, "
              f"expected and missing {sorted(used - set(P))}")
        bad = 1
    blocks = levels * nres + 2 + levels * (nres + 1)
    Fst, K = 6 * blocks + 8 + (7 if hch else 0), B * S * S + 8
    gl, gg = (Fst + 1) * gamma(K), (2 * Fst + 1) * gamma(K)
    rl = abs(ff_loss - loss.item()) / (gl * loss.item())
    print(f"loss fourfold {ff_loss:.9g} torch {loss.item():.12g}: {rl:.4f} of the bound {gl:.3g}")
    bad |= rl > 1
    worst = 0
    for name in P:
        g = P[name].grad
        ref = g.norm().item()
        err = (G[name] - g).norm().item()
        ratio = err / (gg * ref) if ref > 0 else (math.inf if err > 0 else 0)
        worst = max(worst, ratio)
        if ratio > 1:
            print(f"FAIL {name} {shapes[name]}: |err| {err:.3g}, |g| {ref:.3g}, {ratio:.2f} of "
                  f"the bound {gg:.3g}")
            bad = 1
    print(f"{len(P)} gradient tensors: worst {worst:.4f} of the bound (2F+1) gamma_K = {gg:.3g} "
          f"(F = {Fst}, K = {K})")

    # One AdamW step fed fourfold's gradients (as tools/gpt_oracle.py --ff
    # does: the same point): torch's AdamW, decay on the weights (ndim >= 2)
    # only, lr 1e-2, betas (0.9, 0.95), eps 1e-8. Element by element,
    # |p_ff - p_torch| <= 16u (|p| + lr (|r| + wd |p|)), r = m^/(sqrt(v^) + eps):
    # fourfold's update is five float32 operations on the same gradient.
    lr, wd = 1e-2, 0.1
    Q = {name: P[name].detach().clone().requires_grad_(True) for name in P}
    for name in Q:
        Q[name].grad = G[name].clone()
    dec = [Q[n] for n in Q if Q[n].dim() >= 2]
    nodec = [Q[n] for n in Q if Q[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": wd},
                             {"params": nodec, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    opt.step()
    worst_p = 0
    for name in Q:
        g = G[name]
        rr = g.abs() / (g.abs() + 1e-8)
        w = wd if Q[name].dim() >= 2 else 0.0
        p0 = P[name].detach().abs()
        bound = 16 * U * (p0 + lr * (rr + w * p0))
        ratio = ((after[name] - Q[name].detach()).abs() / bound).max().item()
        worst_p = max(worst_p, ratio)
        if ratio > 1:
            print(f"FAIL {name} after AdamW: {ratio:.2f} of the bound")
            bad = 1
    # The schedules in float64 on both sides: within 1e-12 relative (a
    # product of 1000 factors, each within a few float64 roundings).
    for k, (name, ref) in enumerate([("cosine", alpha_bar(nT, 1, 1e-4, 0.02)),
                                     ("linear", alpha_bar(nT, 0, 1e-4, 0.02))]):
        rel = ((ff_abar[k] - ref).abs() / ref).max().item()
        print(f"alpha_bar {name}, T = {nT}: max relative difference {rel:.2e}")
        if not rel <= 1e-12:
            print(f"FAIL alpha_bar {name}")
            bad = 1
    # One reverse step from fourfold's x_T (T = 1, beta 0.5: alpha = abar =
    # 0.5): x_0 = r (x_T - k eps(x_T, 0)), r = 1/sqrt(alpha), k = beta /
    # sqrt(1 - abar); fourfold's eps within F gamma of its norm (F stages of
    # the forward), the update's three operations within 3u:
    # |d out| <= r k F gamma |eps| + 3u r (|x_T| + k |eps|), norm-wise.
    with torch.no_grad():
        eps = model(xT, torch.zeros(B, dtype=torch.long))
        beta = 0.5
        ab = alpha_bar(1, 0, beta, beta)[0].item()
        rr, kk = 1 / math.sqrt(1 - beta), beta / math.sqrt(1 - ab)
        ref = rr * (xT - kk * eps)
        sb = rr * kk * (Fst - 1) * gamma(K) * eps.norm().item() + \
            3 * U * rr * (xT.norm().item() + kk * eps.norm().item())
        rs = (ff_sample - ref).norm().item() / sb
    print(f"one reverse step: |err| {rs:.4f} of the bound {sb:.3g}")
    if not rs <= 1:
        print("FAIL the reverse step")
        bad = 1
    print(f"parameters after one AdamW step: worst {worst_p:.4f} of the bound "
          f"16u (|p| + lr (|r| + wd |p|)); {'FAILED' if bad else 'passed'}")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
