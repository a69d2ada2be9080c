#!/usr/bin/python3
"""PyTorch oracle for fourfold's GPT-2 training (run with /usr/bin/python3).

  gpt_oracle.py --ckpt model.bin --batch batch.bin --out DIR [--seqs B]
      [--steps 10] [--lr 3e-3 --warmup 3 --min-lr-frac 0.1 --wd 0.1
       --beta1 0.9 --beta2 0.95 --eps 1e-8 --clip 1.0]
      [--dtype float32|float64] [--threads 1]

Step s (0-based) trains on sequences [s*B, (s+1)*B) of the batch file, which
must hold steps*B sequences (default B = N // steps).  Writes into DIR:

  oracle_logits.bin  raw little-endian float32, (B, T, Vp) row-major: logits of
                     step 0's batch under the checkpoint's parameters
  oracle_grads.bin   v3 checkpoint layout (same header as the model): gradients
                     of step 0's mean loss, before clipping
  oracle.json        {"loss": step-0 loss before any update,
                      "losses": [loss of step s, before its update],
                      "grad_norms": [global grad norm of step s, before clipping],
                      "lrs": [learning rate of step s], "dtype": ...,
                      plus B, T, V, Vp, steps and the hyperparameters}

Formats are described in gpt_torch.py.  Tensors are computed in --dtype and
written as float32.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch as gt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqs", type=int, default=None, help="sequences per step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    if a.steps < 1:
        sys.exit("gpt_oracle: --steps must be >= 1")
    try:
        cfg, tensors = gt.read_checkpoint(a.ckpt)
        tokens, targets = gt.read_batch(a.batch)
    except (OSError, ValueError) as e:
        sys.exit(f"gpt_oracle: {e}")
    N, T = tokens.shape
    B = a.seqs if a.seqs is not None else N // a.steps
    if B < 1 or a.steps * B > N:
        sys.exit(f"gpt_oracle: batch file holds {N} sequences, need steps*seqs = "
                 f"{a.steps}*{B}")
    if T > cfg["maxT"]:
        sys.exit(f"gpt_oracle: batch T={T} exceeds checkpoint maxT={cfg['maxT']}")
    os.makedirs(a.out, exist_ok=True)

    dtype = torch.float64 if a.dtype == "float64" else torch.float32
    model = gt.GPT2(cfg, tensors, dtype=dtype)
    opt = gt.make_optimizer(model, a.lr, a.wd, a.beta1, a.beta2, a.eps)

    def dump_step0(logits, loss):
        logits.detach().to(torch.float32).numpy().astype("<f4").tofile(
            os.path.join(a.out, "oracle_logits.bin"))
        grads = {n: model.params[n].grad for n in gt.PARAM_NAMES}
        gt.write_checkpoint(os.path.join(a.out, "oracle_grads.bin"), cfg, grads)

    losses, norms, lrs = [], [], []
    for s in range(a.steps):
        lr = gt.lr_at(s, a.steps, a.lr, a.warmup, a.min_lr_frac)
        sl = slice(s * B, (s + 1) * B)
        loss, norm, _ = gt.train_step(model, opt, tokens[sl], targets[sl], lr,
                                      a.clip, dump_step0 if s == 0 else None)
        losses.append(loss)
        norms.append(norm)
        lrs.append(lr)
        print(f"step {s:3d}  loss {loss:.9f}  grad_norm {norm:.6e}  lr {lr:.6e}")

    res = {"loss": losses[0], "losses": losses, "grad_norms": norms, "lrs": lrs,
           "dtype": a.dtype, "B": B, "T": T, "V": cfg["V"], "Vp": cfg["Vp"],
           "steps": a.steps, "lr": a.lr, "warmup": a.warmup,
           "min_lr_frac": a.min_lr_frac, "wd": a.wd, "beta1": a.beta1,
           "beta2": a.beta2, "eps": a.eps, "clip": a.clip}
    with open(os.path.join(a.out, "oracle.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
