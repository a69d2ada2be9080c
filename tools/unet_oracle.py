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
(2F + 1) gamma_{K+8} of its norm, F = 6 per residual block + 8 (+ 7 per
attention block: GroupNorm 2, QKV, scores, softmax, P V, projection), K the
batch's pixels (the longest reduction); and the parameters after one AdamW
step on fourfold's gradients, torch.optim.AdamW's, element by element; the
cosine and linear schedules' alpha_bar at T = 1000 within 1e-12; one
reverse step of the sampler (T = 1) from fourfold's x_T; improved DDPM's
respacing (its space_timesteps for one section and the kept steps' betas,
written here from the paper's code's definition) for several T and K: the
kept timesteps exactly, the betas within their float64 bound; and each step
of sampling in 4 of T = 100 steps (improved DDPM's sampler: x0^ clipped,
the posterior mean and variance of the respaced process, written here from
its definition), x_T and the noise drawn here by an independent
Philox4x32-10 (Random123's definition, checked against its known-answer
vectors) and Box-Muller;
ff_unet_init's parameters (DIR/unet_init.bin) against PyTorch's default
initialisation of each unsplit layer, drawn by this Philox (check_init).
Exit status 1 on a failure."""
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

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
    a = t[:, None].to(freqs.dtype) * freqs[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=1)


M0, M1, W0, W1, MASK = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF


def philox(ctr, key):
    """Philox4x32-10 (Salmon et al., SC'11; Random123's philox.h): ten
    rounds of two 32x32 -> 64 products, the key bumped by the Weyl
    constants between rounds."""
    c, k = list(ctr), list(key)
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & MASK, (p0 >> 32) ^ c[3] ^ k[1], p0 & MASK]
        k = [(k[0] + W0) & MASK, (k[1] + W1) & MASK]
    return c


def normal(seed, stream, index):
    """include/fourfold/rng.h's ff_rng_normal: the block of counter (index
    low, index high, stream, 0) and key (seed low, seed high); two uniforms
    of 53 bits (the words' top bits, centred in (0, 1)); Box-Muller's cosine
    in double, rounded to float32."""
    r = philox([index & MASK, index >> 32, stream, 0], [seed & MASK, seed >> 32])
    u1 = ((((r[0] << 32) | r[1]) >> 11) + 0.5) / 2.0 ** 53
    u2 = ((((r[2] << 32) | r[3]) >> 11) + 0.5) / 2.0 ** 53
    return float(np.float32(math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)))


def sample_noise(seed, g, t, T, per):
    """The sampler's draws for image g at timestep t (x_T at t = T): stream
    0xDD03, indices ((g (T + 1) + t) per + e) (include/fourfold/unet.h)."""
    at = (g * (T + 1) + t) * per
    return [normal(seed, 0xDD03, at + e) for e in range(per)]


def space_timesteps(T, K):
    """improved DDPM's respace.space_timesteps(T, [K]): one section of all
    T steps, K of them at a fractional stride, Python's round."""
    stride = 1 if K <= 1 else (T - 1) / (K - 1)
    cur, taken = 0.0, []
    for _ in range(K):
        taken.append(round(cur))
        cur += stride
    return sorted(set(taken))


def unet_model(P, S, ci, pad, base, levels, mult, nres, gch, tmult, hch, used=None, init=None,
               attn_levels=0):
    """The U-Net of include/fourfold/unet.h as a function model(x_t, t) of
    the parameter tensors P (PyTorch's state_dict names and shapes, each
    checked against the model's), NCHW in P's dtype: improved DDPM's
    layout, torch.cat for the skips. With init (a function of a name and a
    shape), P starts empty and each tensor is init(name, shape) at its
    first use (bench/unet_torch_bench.py). `used` collects the names read.
    attn_levels: bit i, every residual block of level i (down and up) is
    followed by self-attention (improved DDPM's attention_resolutions)."""
    used = set() if used is None else used
    temb = base * tmult

    def p(name, shape):
        used.add(name)
        if name not in P and init is not None:
            P[name] = init(name, shape)
        if tuple(P[name].shape) != tuple(shape):
            raise ValueError(f"{name}: shape {tuple(P[name].shape)}, the model's {tuple(shape)}")
        return P[name]

    def gn(name, h):
        C = h.shape[1]
        return F.group_norm(h, C // gch, p(name + ".weight", (C,)), p(name + ".bias", (C,)),
                            eps=1e-5)

    def conv(name, h, cout, k):
        return F.conv2d(h, p(name + ".weight", (cout, h.shape[1], k, k)),
                        p(name + ".bias", (cout,)), padding=k // 2)

    def linear(name, x, nout):
        return F.linear(x, p(name + ".weight", (nout, x.shape[-1])), p(name + ".bias", (nout,)))

    def res(name, h, cout, semb):
        y = conv(name + ".conv1", F.silu(gn(name + ".norm1", h)), cout, 3)
        y = y + linear(name + ".temb", semb, cout)[:, :, None, None]
        y = conv(name + ".conv2", F.silu(gn(name + ".norm2", y)), cout, 3)
        skip = conv(name + ".skip", h, cout, 1) if h.shape[1] != cout else h
        return skip + y

    def attn(name, h):
        # x + proj(softmax(q k^T / sqrt(hs)) v) over the pixels, heads of hch
        Bn, C, H, W = h.shape
        y = gn(name + ".norm", h).reshape(Bn, C, H * W).transpose(1, 2)
        qkv = linear(name + ".qkv", y, 3 * C)
        q, k, v = (z.reshape(Bn, H * W, C // hch, hch).transpose(1, 2) for z in qkv.chunk(3, -1))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hch), dim=-1)
        o = (a @ v).transpose(1, 2).reshape(Bn, H * W, C)
        o = linear(name + ".proj", o, C)
        return h + o.transpose(1, 2).reshape(Bn, C, H, W)

    def model(xt, t):
        x = torch.cat([xt, xt.new_zeros(xt.shape[0], pad - ci, S, S)], dim=1)
        emb = timestep_embedding(t, base).to(xt.dtype)
        emb = linear("temb.lin2", F.silu(linear("temb.lin1", emb, temb)), temb)
        semb = F.silu(emb)
        h = conv("conv_in", x, base, 3)
        hs = [h]
        for i in range(levels):
            for j in range(nres):
                h = res(f"down{i}.res{j}", h, base * mult[i], semb)
                if attn_levels >> i & 1:
                    h = attn(f"down{i}.attn{j}", h)
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
                if attn_levels >> i & 1:
                    h = attn(f"up{i}.attn{j}", h)
            if i != 0:
                h = F.interpolate(h, scale_factor=2, mode="nearest")
        out = conv("conv_out", F.silu(gn("norm_out", h)), pad, 3)
        return out[:, :ci]

    return model


def check_init(path):
    """fourfold's ff_unet_init (DIR/unet_init.bin, the serial model's
    canonical tensors) against PyTorch's default initialisation of each
    unsplit layer (nn.Conv2d's and nn.Linear's reset_parameters: the weight
    kaiming_uniform_ with a = sqrt(5), bound 1/sqrt(fan_in), the bias
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with the weight's fan_in; GroupNorm
    1 and 0), fan_in by torch's own _calculate_fan_in_and_fan_out of the
    whole (concatenated) weight. The draws: element e of tensor i is
    (2 u - 1) / sqrt(fan_in), u the uniform of this Philox at (seed, stream
    0xD000 + i, e): each value exactly, and within the bound."""
    r = Reader(path)
    seed, nt = r.ints(2)
    tensors = []
    for _ in range(nt):
        (n,) = r.ints(1)
        name = r.text(n)
        (nd,) = r.ints(1)
        shape = r.ints(nd)
        tensors.append((name, shape, r.floats(int(np.prod(shape))).reshape(shape)))
    r.done()
    fans, bad, drawn = {}, 0, 0
    for name, shape, w in tensors:
        if name.endswith(".weight") and len(shape) >= 2:
            fans[name[:-len(".weight")]] = torch.nn.init._calculate_fan_in_and_fan_out(w)[0]
    for i, (name, shape, w) in enumerate(tensors):
        layer = name.rsplit(".", 1)[0]
        if layer not in fans:  # a GroupNorm
            want = torch.ones(shape) if name.endswith(".weight") else torch.zeros(shape)
        else:
            bound = 1 / math.sqrt(fans[layer])
            if not (w.abs() <= bound * (1 + U)).all():  # (a value rounded to float32)
                print(f"FAIL init {name}: |w| {w.abs().max().item():.4g} above torch's bound "
                      f"{bound:.4g} (fan_in {fans[layer]})")
                bad = 1
            vals = []
            for e in range(w.numel()):
                c = philox([e & MASK, e >> 32, 0xD000 + i, 0], [seed & MASK, seed >> 32])
                u = ((((c[0] << 32) | c[1]) >> 11) + 0.5) / 2.0 ** 53
                vals.append(float(np.float32((2 * u - 1) * bound)))
            want = torch.tensor(vals).reshape(shape)
            drawn += w.numel()
        if not torch.equal(w, want):
            print(f"FAIL init {name}: {(w != want).sum().item()} of {w.numel()} values are not "
                  f"PyTorch's default initialisation's draws")
            bad = 1
    print(f"initialisation: {nt} tensors, {drawn} values drawn as PyTorch's default of the "
          f"unsplit layers (fan_in of the whole weight), exactly: {'FAILED' if bad else 'passed'}")
    return bad


def alpha_bar(T, schedule, b0, b1):
    if schedule == 0:
        betas = torch.linspace(b0, b1, T) if T > 1 else torch.tensor([b0])
    else:
        s = 0.008
        f = lambda i: math.cos((i / T + s) / (1 + s) * math.pi / 2) ** 2
        betas = torch.tensor([min(1 - f(i + 1) / f(i), 0.999) for i in range(T)])
    return torch.cumprod(1 - betas, 0)


def reverse_steps(what, model, states, abar, kept, draws, Fst, K, ddim=False):
    """Improved DDPM's sampler (Nichol and Dhariwal 2021, its
    gaussian_diffusion.py: p_mean_variance with clip_denoised and the
    FIXED_SMALL variance, on the betas respaced to the kept timesteps) step
    by step: states[0] is x_T and states[j + 1] fourfold's image after step
    i = K-1-j, which is checked against the step applied here to states[j].
    The respaced process: abar_k = abar[kept[k]], abar_prev_k = abar_{k-1}
    (1 at k = 0), beta_k = 1 - abar_k/abar_prev_k; pred_xstart = x/sqrt(abar)
    - sqrt(1/abar - 1) eps clamped to [-1, 1]; the posterior mean coef1
    pred_xstart + coef2 x, coef1 = beta sqrt(abar_prev)/(1 - abar), coef2 =
    (1 - abar_prev) sqrt(1 - beta)/(1 - abar); the variance beta (1 -
    abar_prev)/(1 - abar), its noise draws[k] (none at k = 0). With ddim,
    DDIM's step (Song et al. 2021, eq. 12, eta = 0, as improved DDPM's
    ddim_sample): the noise of the clipped pred_xstart, eps' = (x/sqrt(abar)
    - pred_xstart)/sqrt(1/abar - 1), and sqrt(abar_prev) pred_xstart +
    sqrt(1 - abar_prev) eps', no noise; coef1 and coef2 below are then its
    derivatives in pred_xstart (|.|) and x.

    Bound, norm-wise over the batch: fourfold's eps is within (F-1) gamma_K
    |eps| of the exact (the forward's stages), the clip is 1-Lipschitz, so
    the mean is within coef1 sqrt(1/abar - 1) (F-1) gamma_K |eps|; x0^
    before the clip within 2e-12 (|x|/sqrt(abar) + sqrt(1/abar - 1) |eps|)
    (alpha_bar's 1e-12 relative, checked above at T = 1000, and three double
    roundings); the rest of the double arithmetic (the coefficients: 1 -
    abar_prev within 1e-12 abar_prev, at most 1e-8 of itself here) within u
    (coef1 |x0^| + coef2 |x| + sigma |z|), the rounding to float32 as much
    again, a draw one float ulp off 2u sigma |z|. The clip must be active (some |x0^| > 1) at every step,
    or the check could not see its absence; printed: how far from this step
    the step without the clip and the step with the variance beta (improved
    DDPM's fixed large) are, in bounds."""
    ab = abar[kept]
    prev = torch.cat([ab.new_ones(1), ab[:-1]])
    beta = 1 - ab / prev
    coef1, coef2 = beta * prev.sqrt() / (1 - ab), (1 - prev) * (1 - beta).sqrt() / (1 - ab)
    var = beta * (1 - prev) / (1 - ab)
    if ddim:
        coef1 = (prev.sqrt() - (1 - prev).sqrt() / (1 / ab - 1).sqrt()).abs()
        coef2 = (1 - prev).sqrt() / ab.sqrt() / (1 / ab - 1).sqrt()
        var = torch.zeros_like(var)
    bad = 0
    for j, k in enumerate(reversed(range(len(kept)))):
        x, t = states[j], kept[k]
        with torch.no_grad():
            eps = model(x, torch.full((x.shape[0],), t, dtype=torch.long))
        raw = x / ab[k].sqrt() - (1 / ab[k] - 1).sqrt() * eps
        x0 = raw.clamp(-1, 1)
        z = draws[k] if k > 0 and draws is not None else torch.zeros_like(x)
        sg = var[k].sqrt() if k > 0 else torch.tensor(0.0)
        if ddim:
            e2 = (x / ab[k].sqrt() - x0) / (1 / ab[k] - 1).sqrt()
            ref = prev[k].sqrt() * x0 + (1 - prev[k]).sqrt() * e2
        else:
            ref = coef1[k] * x0 + coef2[k] * x + sg * z
        sb = (coef1[k] * (1 / ab[k] - 1).sqrt() * (Fst - 1) * gamma(K) * eps.norm()
              + coef1[k] * 2e-12 * (x.norm() / ab[k].sqrt() + (1 / ab[k] - 1).sqrt() * eps.norm())
              + 2 * U * (coef1[k] * x0.norm() + coef2[k] * x.norm() + sg * z.norm())
              + 2 * U * sg * z.norm()).item()
        err = (states[j + 1] - ref).norm().item() / sb
        clipped = int((raw.abs() > 1).sum())
        noclip = (coef1[k] * (raw - x0)).norm().item() / sb
        large = ((beta[k].sqrt() - sg) * z).norm().item() / sb
        print(f"{what}: t = {t} (beta {beta[k]:.4g}, sigma {sg:.4g}, coef1 {coef1[k]:.4g}, "
              f"coef2 {coef2[k]:.4g}): |err| {err:.4f} of the bound {sb:.3g}; x0^ clipped in "
              f"{clipped} of {raw.numel()} values (without the clip {noclip:.3g} bounds away, "
              f"with beta for beta~ {large:.3g})")
        if not err <= 1:
            print(f"FAIL {what} at t = {t}")
            bad = 1
        if clipped == 0:
            print(f"FAIL {what} at t = {t}: the clip is not active, the check cannot see it")
            bad = 1
    return bad


def main(path):
    r = Reader(path)
    S, ci, pad, base, levels = r.ints(5)
    mult = r.ints(levels)
    nres, gch, tmult, T, schedule, B, nt, hch, alv = r.ints(9)
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
    (nrs,) = r.ints(1)
    respaced = []
    for _ in range(nrs):
        rT, rsch, rK = r.ints(3)
        rb = r.doubles(2)
        respaced.append((rT, rsch, rK, rb, r.ints(rK), r.doubles(rK)))
    cseed, cT, cK, csch = r.ints(4)
    cb = r.doubles(2)
    ff_chain = [r.floats(B * S * S * ci).reshape(B, S, S, ci).permute(0, 3, 1, 2)
                for _ in range(cK + 1)]
    ff_ddim = [r.floats(B * S * S * ci).reshape(B, S, S, ci).permute(0, 3, 1, 2)
               for _ in range(cK + 1)]
    r.done()

    used = set()
    model = unet_model(P, S, ci, pad, base, levels, mult, nres, gch, tmult, hch, used=used,
                       attn_levels=alv)

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
    attns = (1 if hch else 0) + sum(2 * nres + 1 for i in range(levels) if alv >> i & 1)
    Fst, K = 6 * blocks + 8 + 7 * attns, B * S * S + 8
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
    # One reverse step from fourfold's x_T (T = 1, beta 0.5): improved
    # DDPM's last step, whose posterior mean is the clipped x0^ itself
    bad |= reverse_steps("one reverse step (T = 1, beta 0.5)", model, [xT, ff_sample],
                         alpha_bar(1, 0, 0.5, 0.5), [0], None, Fst, K)
    # This Philox against Random123's known-answer vectors (kat_vectors)
    for ctr, key, want in [([0] * 4, [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
                           ([MASK] * 4, [MASK] * 2, [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
                           ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0],
                            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1])]:
        if philox(ctr, key) != want:
            print(f"FAIL the oracle's Philox on the known answer {want}")
            bad = 1
    # Respacing: the kept steps exactly; each beta_k = 1 - abar(t_k) /
    # abar(t_{k-1}) within 2 (1e-12) abar(t_k)/abar(t_{k-1}) + 2^-52 of
    # ours (each alpha_bar within 1e-12 relative, as checked above, and the
    # division's and subtraction's roundings)
    worst_b = 0
    for rT, rsch, rK, (rb0, rb1), kept, betas in respaced:
        want = space_timesteps(rT, rK)
        ab = alpha_bar(rT, rsch, rb0, rb1).tolist()
        if kept != want:
            print(f"FAIL respacing T = {rT}, K = {rK}: kept {kept[:8]}..., want {want[:8]}...")
            bad = 1
            continue
        prev = 1.0
        for t, b in zip(want, betas):
            ratio = ab[t] / prev
            err = abs(b - (1 - ratio)) / (2e-12 * ratio + 2.0 ** -52)
            worst_b = max(worst_b, err)
            prev = ab[t]
        print(f"respaced T = {rT} ({'cosine' if rsch else 'linear'}), K = {rK}: kept "
              f"{want[:3]} ... {want[-2:]}, betas {betas[0]:.4g} .. {betas[-1]:.4g}")
    print(f"respaced betas: worst {worst_b:.4f} of the bound")
    if not worst_b <= 1:
        print("FAIL the respaced betas")
        bad = 1
    # Sampling in K = 4 of the T = 100 steps of the test's schedule, each
    # step from fourfold's state before it, x_T and every z drawn here
    per = S * S * ci
    kept = space_timesteps(cT, cK)
    draws = [torch.tensor([sample_noise(cseed, g, t, cT, per) for g in range(B)])
             .reshape(B, S, S, ci).permute(0, 3, 1, 2) for t in kept + [cT]]
    # x_T: fourfold's draws are this Philox's and Box-Muller's, each within
    # one float32 ulp (2u |z|: libm's log and cos against Python's)
    dx = ((ff_chain[0] - draws[-1]).abs() - 2 * U * draws[-1].abs()).max().item()
    print(f"x_T of the chain: the oracle's draws, worst excess over one ulp {max(dx, 0):.3g}")
    if dx > 0:
        print("FAIL x_T of the chain")
        bad = 1
    bad |= reverse_steps(f"sampling in {cK} of T = {cT} steps", model, ff_chain,
                         alpha_bar(cT, csch, cb[0], cb[1]), kept, draws, Fst, K)
    # DDIM's chain (eta = 0) from the same x_T, no noise after it
    if not torch.equal(ff_ddim[0], ff_chain[0]):
        print("FAIL DDIM's x_T is not DDPM's")
        bad = 1
    bad |= reverse_steps(f"DDIM in {cK} of T = {cT} steps", model, ff_ddim,
                         alpha_bar(cT, csch, cb[0], cb[1]), kept, None, Fst, K, ddim=True)
    print(f"parameters after one AdamW step: worst {worst_p:.4f} of the bound "
          f"16u (|p| + lr (|r| + wd |p|)); {'FAILED' if bad else 'passed'}")
    return bad


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    failed = main(sys.argv[1])
    failed |= check_init(os.path.join(os.path.dirname(sys.argv[1]), "unet_init.bin"))
    sys.exit(failed)
