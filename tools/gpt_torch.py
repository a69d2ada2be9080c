#!/usr/bin/python3
"""Independent PyTorch reference for fourfold's GPT-2 (docs/design.md §4).

Run with Debian's /usr/bin/python3 (torch 1.13 + numpy).  Contents:

  read_checkpoint / write_checkpoint  llm.c gpt2 v3 fp32 files (parameters,
                                      gradients or AdamW moments, same layout;
                                      dtype "<f8": the same layout in float64)
  read_batch                          fourfold batch files (tokens + targets)
  GPT2                                the model built from the 16 tensors
                                      (bf16=True: fourfold's bf16-mixed products)
  make_optimizer / lr_at / train_step AdamW exactly as the oracle uses it
  adamw_state / set_params / optimizer_step
                                      torch's moments; loading an iterate;
                                      an AdamW step on given gradients

Checkpoint format (all little-endian): 256 int32 header
  [0]=20240326 [1]=3 [2]=maxT [3]=V [4]=L [5]=NH [6]=C [7]=Vp, rest 0,
then float32 arrays in the order of PARAM_NAMES with the shapes of
param_shapes().  Linear weights are stored (out, in) like torch.nn.Linear.
The oracle's float64 results use the same header with float64 arrays (the
file size tells them apart; read them with dtype="<f8").

Batch format: 256 int32 header [0]=20241122 [1]=1 [2]=N [3]=T, rest 0,
then int32 tokens (N, T), then int32 targets (N, T).
"""
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

CKPT_MAGIC = 20240326
CKPT_VERSION = 3
BATCH_MAGIC = 20241122
BATCH_VERSION = 1
HEADER_INTS = 256

PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw",
               "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb",
               "lnfw", "lnfb"]
# Tensors that get weight decay (all 2-D matrices); the rest get none.
DECAY_NAMES = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}
CFG_KEYS = ["maxT", "V", "L", "NH", "C", "Vp"]


def padded_vocab(V):
    """Vocabulary padded up to a multiple of 128, as llm.c does."""
    return (V + 127) // 128 * 128


def param_shapes(cfg):
    """Ordered dict name -> shape for a config dict with maxT,V,L,NH,C,Vp."""
    maxT, L, C, Vp = cfg["maxT"], cfg["L"], cfg["C"], cfg["Vp"]
    return {
        "wte": (Vp, C), "wpe": (maxT, C),
        "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
        "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C),
        "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }


def _check_cfg(cfg, where):
    for k in CFG_KEYS:
        if not isinstance(cfg.get(k), int) or cfg[k] <= 0:
            raise ValueError(f"{where}: bad or missing config value {k}={cfg.get(k)!r}")
    if cfg["C"] % cfg["NH"]:
        raise ValueError(f"{where}: C={cfg['C']} not divisible by NH={cfg['NH']}")
    if cfg["Vp"] < cfg["V"]:
        raise ValueError(f"{where}: Vp={cfg['Vp']} < V={cfg['V']}")


def _read_header(f, path, magic, version, what):
    """The 256-int32 header of a checkpoint or batch file, magic and version checked."""
    hdr = np.fromfile(f, dtype="<i4", count=HEADER_INTS)
    if hdr.size != HEADER_INTS:
        raise ValueError(f"{path}: too short for a {HEADER_INTS}-int32 header")
    if hdr[0] != magic:
        raise ValueError(f"{path}: bad {what}magic {hdr[0]} (want {magic})")
    if hdr[1] != version:
        raise ValueError(f"{path}: {what}version {hdr[1]} unsupported (want {version}"
                         f"{', fp32' if not what else ''})")
    return hdr


def read_checkpoint(path, dtype="<f4"):
    """Read a v3 fp32 checkpoint (or gradient or moment file); dtype "<f8"
    reads the oracle's float64 files of the same layout.

    Returns (cfg, tensors): cfg a dict maxT,V,L,NH,C,Vp; tensors a dict
    name -> numpy array (float32, or float64 for "<f8") in PARAM_NAMES order.
    Raises ValueError on wrong magic, version or file size.
    """
    item = np.dtype(dtype).itemsize
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        hdr = _read_header(f, path, CKPT_MAGIC, CKPT_VERSION, "")
        cfg = dict(zip(CFG_KEYS, (int(x) for x in hdr[2:8])))
        _check_cfg(cfg, path)
        shapes = param_shapes(cfg)
        n = sum(int(np.prod(s)) for s in shapes.values())
        want = 4 * HEADER_INTS + item * n
        if size != want:
            raise ValueError(f"{path}: size {size} bytes, header implies {want} "
                             f"({np.dtype(dtype).name} data)")
        data = np.fromfile(f, dtype=dtype, count=n)
    tensors, off = {}, 0
    native = np.float64 if item == 8 else np.float32
    for name, shape in shapes.items():
        k = int(np.prod(shape))
        tensors[name] = data[off:off + k].reshape(shape).astype(native)
        off += k
    return cfg, tensors


def write_checkpoint(path, cfg, tensors, dtype="<f4"):
    """Write cfg (maxT,V,L,NH,C,Vp) and 16 tensors (numpy or torch) as v3 fp32,
    or with dtype "<f8" the same layout in float64."""
    _check_cfg(cfg, "write_checkpoint")
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[0], hdr[1] = CKPT_MAGIC, CKPT_VERSION
    hdr[2:8] = [cfg[k] for k in CFG_KEYS]
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        for name, shape in param_shapes(cfg).items():
            t = tensors[name]
            if isinstance(t, torch.Tensor):
                t = t.detach().cpu().numpy()
            t = np.asarray(t)
            if t.shape != tuple(shape):
                raise ValueError(f"write_checkpoint: {name} has shape {t.shape}, want {shape}")
            f.write(np.ascontiguousarray(t, dtype=dtype).tobytes())


def read_batch(path):
    """Read a fourfold batch file; returns (tokens, targets), int64 numpy (N, T)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        hdr = _read_header(f, path, BATCH_MAGIC, BATCH_VERSION, "batch ")
        N, T = int(hdr[2]), int(hdr[3])
        if N <= 0 or T <= 0:
            raise ValueError(f"{path}: bad N={N} T={T}")
        want = 4 * (HEADER_INTS + 2 * N * T)
        if size != want:
            raise ValueError(f"{path}: size {size} bytes, header implies {want}")
        data = np.fromfile(f, dtype="<i4", count=2 * N * T)
    tokens = data[:N * T].reshape(N, T).astype(np.int64)
    targets = data[N * T:].reshape(N, T).astype(np.int64)
    return tokens, targets


def write_batch(path, tokens, targets):
    """Write int tokens/targets of shape (N, T) as a fourfold batch file."""
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    if tokens.ndim != 2 or tokens.shape != targets.shape:
        raise ValueError("write_batch: tokens and targets must both be (N, T)")
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[0], hdr[1], hdr[2], hdr[3] = BATCH_MAGIC, BATCH_VERSION, *tokens.shape
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
        f.write(np.ascontiguousarray(targets, dtype="<i4").tobytes())


def random_params(cfg, seed=0, std=0.02):
    """Random parameters (numpy float32): weights N(0, std), LayerNorm gains
    1 + N(0, std), biases N(0, std); padded wte rows V..Vp are zero."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        a = rng.normal(0.0, std, size=shape).astype(np.float32)
        if name in ("ln1w", "ln2w", "lnfw"):
            a += 1.0
        out[name] = a
    out["wte"][cfg["V"]:] = 0.0
    return out


def _layernorm(x, w, b, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)  # biased variance
    return xc * torch.rsqrt(var + eps) * w + b


def bf16_round(t):
    """The values of t rounded to bfloat16 (through float32, as fourfold rounds
    its float32 values), in t's dtype."""
    return t.to(torch.float32).to(torch.bfloat16).to(t.dtype)


class _RoundST(torch.autograd.Function):
    """bf16_round forward, the identity backward: a weight read in bf16
    whose gradient reaches its float32 master unchanged."""

    @staticmethod
    def forward(ctx, w):
        return bf16_round(w)

    @staticmethod
    def backward(ctx, g):
        return g


class _Bf16Linear(torch.autograd.Function):
    """y = x w^T + b as fourfold's bf16-mixed linear layer (docs/design.md,
    "Precision"): the product reads x and w rounded to bf16, its backward
    the output gradient rounded to bf16 (the products and the bias's sums);
    the arithmetic itself in the tensors' dtype."""

    @staticmethod
    def forward(ctx, x, w, b):
        xr, wr = bf16_round(x), bf16_round(w)
        ctx.save_for_backward(xr, wr)
        ctx.has_bias = b is not None
        y = xr @ wr.t()
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, gy):
        xr, wr = ctx.saved_tensors
        g = bf16_round(gy)
        g2 = g.reshape(-1, g.shape[-1])
        gx = g @ wr
        gw = g2.t() @ xr.reshape(-1, xr.shape[-1])
        gb = g2.sum(0) if ctx.has_bias else None
        return gx, gw, gb


class _Bf16MatMul(torch.autograd.Function):
    """alpha bf16(a) @ bf16(b) as fourfold's bf16-mixed attention products
    (src/nn/gpt_ops.c, docs/design.md "Precision"): the operands rounded to
    bf16, the backward's products on the output gradient rounded to bf16,
    alpha applied to each product's sum; the arithmetic in the tensors'
    dtype."""

    @staticmethod
    def forward(ctx, a, b, alpha):
        ar, br = bf16_round(a), bf16_round(b)
        ctx.save_for_backward(ar, br)
        ctx.alpha = alpha
        return (ar @ br) * alpha

    @staticmethod
    def backward(ctx, g):
        ar, br = ctx.saved_tensors
        gr = bf16_round(g)
        return (gr @ br.transpose(-1, -2)) * ctx.alpha, (ar.transpose(-1, -2) @ gr) * ctx.alpha, None


class GPT2:
    """GPT-2 from the 16 canonical tensors, written out op by op.

    self.params: dict name -> leaf tensor (requires_grad) of the chosen dtype.
    forward(tokens, targets) -> (logits (B,T,Vp), mean loss over B*T tokens on
    the first V logit columns).
    """

    def __init__(self, cfg, tensors, dtype=torch.float32, bf16=False, bf16_attention=True):
        _check_cfg(cfg, "GPT2")
        self.cfg = dict(cfg)
        self.dtype = dtype
        self.bf16 = bf16
        self.bf16_att = bf16 and bf16_attention
        self.params = {}
        for name, shape in param_shapes(cfg).items():
            t = torch.as_tensor(np.asarray(tensors[name])).to(dtype).clone()
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"GPT2: {name} has shape {tuple(t.shape)}, want {shape}")
            self.params[name] = t.requires_grad_(True)

    def parameters(self):
        return [self.params[n] for n in PARAM_NAMES]

    def forward(self, tokens, targets=None):
        p, cfg = self.params, self.cfg
        L, NH, C, V = cfg["L"], cfg["NH"], cfg["C"], cfg["V"]
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        B, T = tokens.shape
        if T > cfg["maxT"]:
            raise ValueError(f"T={T} exceeds maxT={cfg['maxT']}")
        if tokens.min() < 0 or tokens.max() >= V:
            raise ValueError(f"token ids must lie in [0, {V})")
        hs = C // NH
        scale = 1.0 / math.sqrt(hs)
        causal = torch.ones(T, T, dtype=torch.bool).tril()

        def linear(x, w, b=None):  # x w^T + b, in bf16-mixed fourfold's products
            if self.bf16:
                return _Bf16Linear.apply(x, w, b)
            return x @ w.t() + b if b is not None else x @ w.t()

        wte = _RoundST.apply(p["wte"]) if self.bf16 else p["wte"]  # (the lookup reads bf16)
        x = wte[tokens] + p["wpe"][:T].unsqueeze(0)  # (B,T,C)
        for l in range(L):
            h = _layernorm(x, p["ln1w"][l], p["ln1b"][l])
            qkv = linear(h, p["qkvw"][l], p["qkvb"][l])  # (B,T,3C)
            q, k, v = qkv.split(C, dim=-1)
            q = q.reshape(B, T, NH, hs).transpose(1, 2)  # (B,NH,T,hs)
            k = k.reshape(B, T, NH, hs).transpose(1, 2)
            v = v.reshape(B, T, NH, hs).transpose(1, 2)
            if self.bf16_att:  # bf16 operands, fp32 sums; softmax on fp32 scores; P rounded for P V
                att = _Bf16MatMul.apply(q, k.transpose(-1, -2), scale)
            else:
                att = (q @ k.transpose(-1, -2)) * scale  # (B,NH,T,T)
            att = att.masked_fill(~causal, float("-inf"))
            att = torch.softmax(att, dim=-1)
            y = _Bf16MatMul.apply(att, v, 1.0) if self.bf16_att else att @ v
            y = y.transpose(1, 2).reshape(B, T, C)
            x = x + linear(y, p["attprojw"][l], p["attprojb"][l])
            h = _layernorm(x, p["ln2w"][l], p["ln2b"][l])
            h = linear(h, p["fcw"][l], p["fcb"][l])
            h = F.gelu(h, approximate="tanh")
            x = x + linear(h, p["fcprojw"][l], p["fcprojb"][l])
        x = _layernorm(x, p["lnfw"], p["lnfb"])
        logits = linear(x, p["wte"])  # (B,T,Vp), tied weights
        loss = None
        if targets is not None:
            targets = torch.as_tensor(targets, dtype=torch.long)
            if targets.min() < 0 or targets.max() >= V:
                raise ValueError(f"target ids must lie in [0, {V})")
            loss = F.cross_entropy(logits[..., :V].reshape(B * T, V),
                                   targets.reshape(B * T), reduction="mean")
        return logits, loss


def make_optimizer(model, lr, wd, beta1, beta2, eps):
    """torch.optim.AdamW with decay wd on DECAY_NAMES, 0 on the rest."""
    decay = [model.params[n] for n in PARAM_NAMES if n in DECAY_NAMES]
    nodecay = [model.params[n] for n in PARAM_NAMES if n not in DECAY_NAMES]
    groups = [{"params": decay, "weight_decay": wd},
              {"params": nodecay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps)


def adamw_state(opt, model, key):
    """torch's AdamW state `key` ("exp_avg": m, "exp_avg_sq": v, neither
    bias-corrected) per tensor name; zeros before the first step."""
    out = {}
    for n in PARAM_NAMES:
        p = model.params[n]
        st = opt.state.get(p, {})
        out[n] = st[key].detach() if key in st else torch.zeros_like(p.detach())
    return out


def set_params(model, tensors):
    """Overwrite the model's parameters (in place, keeping the optimizer's
    references) with the 16 tensors, converted to the model's dtype."""
    with torch.no_grad():
        for n in PARAM_NAMES:
            t = torch.as_tensor(np.asarray(tensors[n])).to(model.dtype)
            if tuple(t.shape) != tuple(model.params[n].shape):
                raise ValueError(f"set_params: {n} has shape {tuple(t.shape)}, "
                                 f"want {tuple(model.params[n].shape)}")
            model.params[n].copy_(t)


def lr_at(s, steps, lr, warmup, min_lr_frac):
    """Learning rate of 0-based step s: linear warmup, then cosine to min_lr."""
    if s < warmup:
        return lr * (s + 1) / warmup
    min_lr = lr * min_lr_frac
    decay_ratio = (s - warmup) / max(1, steps - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (lr - min_lr)


def optimizer_step(model, opt, grads, lr, clip):
    """One AdamW step on given gradients (dict name -> array, converted to the
    model's dtype): clip as train_step does, then step at rate lr.
    Returns the gradient norm before clipping."""
    for n in PARAM_NAMES:
        model.params[n].grad = torch.as_tensor(np.asarray(grads[n])).to(model.dtype).clone()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return float(norm)


def train_step(model, opt, tokens, targets, lr, clip, on_grads=None):
    """One step: zero grads, forward, backward, clip, AdamW at rate lr.
    on_grads(logits, loss), if given, runs after backward and before clipping
    (so p.grad holds the raw gradients of the mean loss).
    Returns (loss, grad_norm before clipping, logits)."""
    opt.zero_grad(set_to_none=True)
    logits, loss = model.forward(tokens, targets)
    loss.backward()
    if on_grads is not None:
        on_grads(logits, loss)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return float(loss), float(norm), logits
