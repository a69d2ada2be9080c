#!/usr/bin/python3
"""PyTorch peer for fourfold's U-Net training step (issue 51's measurement).

  unet_torch_bench.py [--preset fmnist|tiny] [--B 16] [--threads 1]
                      [--warmup 2] [--iters 10] [--seed 0]

The U-Net of include/fourfold/unet.h (the `fmnist` preset: 32x32 images
padded to 8 channels, C0 32, mult 1,2,2, 2 blocks a level, GroupNorm of 8
channels, attention of 8-channel heads at 8x8, 1,423,336 parameters) built
by tools/unet_oracle.py's unet_model (imported, not copied: the model
unet_oracle checks against fourfold's in float64, here in float32;
torch.cat for the skips), weights and biases U(-1/sqrt(fan_in),
1/sqrt(fan_in)) as ff_unet_init's (PyTorch's default; GroupNorm gains 1),
random images in [-1, 1]. Times complete training steps as fourfold's
ff_unet_step: zero_grad, the DDPM objective (a timestep and noise per
image, x_t = sqrt(abar) x0 + sqrt(1 - abar) eps, the mean squared error of
the predicted noise), backward, clip_grad_norm_(1.0),
AdamW (lr 2e-3, betas 0.9/0.95, eps 1e-8, decay 0.1 on the convolutions'
and linear layers' weights only).

Run it under the same conditions as fourfold (bench/unet.sh does):

  OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=N /usr/bin/python3 \\
      bench/unet_torch_bench.py --threads N ...

Prints each timed step in ms, then one JSON line:
  {"peer":"pytorch","model":"unet-fmnist","params":..,"B":..,"threads":..,
   "median_ms":..,"runs_ms":[...],"torch":..}
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))
from unet_oracle import alpha_bar, unet_model  # noqa: E402  (tools/unet_oracle.py)

# ff_unet_preset's (src/nn/unet.c): S, img channels, pad, C0, levels, mult,
# blocks, group width, embedding multiple, attention head channels, T, betas
PRESETS = {
    "fmnist": dict(S=32, ci=1, pad=8, base=32, levels=3, mult=(1, 2, 2), nres=2, gch=8, tmult=4,
                   hch=8, T=1000, b0=1e-4, b1=0.02),
    "tiny": dict(S=8, ci=1, pad=8, base=8, levels=2, mult=(1, 2), nres=1, gch=4, tmult=4,
                 hch=2, T=100, b0=1e-4, b1=0.2),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="fmnist", choices=sorted(PRESETS))
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    c = PRESETS[a.preset]
    B, S, ci = a.B, c["S"], c["ci"]

    fans = {}

    def init(name, shape):
        # PyTorch's default of the unsplit layer, as ff_unet_init: weight and
        # bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (the weight is made first)
        layer = name.rsplit(".", 1)[0]
        if len(shape) >= 2:
            fans[layer] = math.prod(shape[1:])
        if layer in fans:
            bound = 1 / math.sqrt(fans[layer])
            return ((torch.rand(shape) * 2 - 1) * bound).requires_grad_(True)
        gain = name.endswith(".weight")  # a GroupNorm
        return (torch.ones(shape) if gain else torch.zeros(shape)).requires_grad_(True)

    P = {}
    model = unet_model(P, S, ci, c["pad"], c["base"], c["levels"], c["mult"], c["nres"], c["gch"],
                       c["tmult"], c["hch"], init=init)
    abar = alpha_bar(c["T"], 0, c["b0"], c["b1"]).float()
    x0 = torch.rand(B, ci, S, S) * 2 - 1
    with torch.no_grad():  # a first pass creates the parameters
        model(x0, torch.zeros(B, dtype=torch.long))
    params = sum(t.numel() for t in P.values())
    decay = [t for t in P.values() if t.dim() >= 2]
    rest = [t for t in P.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95), eps=1e-8)

    def step():
        opt.zero_grad(set_to_none=True)
        t = torch.randint(0, c["T"], (B,))
        eps = torch.randn(B, ci, S, S)
        ab = abar[t][:, None, None, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        loss = F.mse_loss(model(xt, t), eps)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        opt.step()
        return loss.item()

    runs = []
    for i in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        loss = step()
        ms = (time.perf_counter() - t0) * 1e3
        if i >= a.warmup:
            runs.append(ms)
            print(f"step {i - a.warmup + 1}: {ms:.1f} ms, loss {loss:.4f}", flush=True)
    print(json.dumps({"peer": "pytorch", "model": "unet-" + a.preset, "params": params, "B": B,
                      "threads": a.threads, "median_ms": round(statistics.median(runs), 3),
                      "runs_ms": [round(x, 3) for x in runs], "torch": torch.__version__}))


if __name__ == "__main__":
    main()
