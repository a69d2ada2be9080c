#!/usr/bin/python3
"""PyTorch oracle for fourfold's GPT-2 training (run with /usr/bin/python3).

  gpt_oracle.py --ckpt model.bin --batch batch.bin --out DIR [--seqs B]
      [--steps 10] [--lr 3e-3 --warmup 3 --min-lr-frac 0.1 --wd 0.1
       --beta1 0.9 --beta2 0.95 --eps 1e-8 --clip 1.0]
      [--dtype float32|float64] [--threads 1] [--ff FFDIR]
      [--precision fp32|bf16-mixed] [--attention bf16|fp32]

Step s (0-based) trains on sequences [s*B, (s+1)*B) of the batch file, which
must hold steps*B sequences (default B = N // steps).

Two trajectories:
  own (no --ff)   the oracle trains on its own: step s's gradients at its own
                  parameters after s steps, its own AdamW.
  fourfold (--ff) the oracle follows fourfold's run, written by
                  `test_gpt --dump FFDIR`: step s's loss and gradients are
                  computed at fourfold's parameters before step s
                  (FFDIR/model.bin for s = 0, FFDIR/ff_params_S.bin after),
                  and torch's AdamW is fed fourfold's gradients of each step
                  (FFDIR/ff_grads_S.bin), so that the state after the steps
                  is torch's AdamW applied to them.  Two runs that differ by
                  rounding drift apart by an amount no rounding bound covers
                  (it depends on the loss surface); following fourfold's run,
                  every comparison is at the same point (docs/testing.md).

Writes into DIR, arrays in --dtype (float64: the same layouts with 8-byte
elements), little-endian:

  oracle_logits.bin    raw (B, T, Vp) row-major: logits of step 0's batch under
                       the checkpoint's parameters
  oracle_grads_S.bin   v3 checkpoint layout: gradients of step S's mean loss,
                       before clipping, S = 0 .. steps-1
  oracle_params.bin    v3 layout: the parameters after the steps
  oracle_adam_m.bin    v3 layout: AdamW's first moment after the steps
                       (torch's exp_avg: not bias-corrected)
  oracle_adam_v.bin    v3 layout: the second moment (exp_avg_sq)
  oracle.json          {"loss": step-0 loss before any update,
                        "losses": [loss of step s, before its update],
                        "grad_norms": [global norm of step s's gradients, before
                                       clipping; with --ff, of fourfold's],
                        "lrs": [learning rate of step s], "dtype": ...,
                        "trajectory": "own" | "fourfold",
                        plus B, T, V, Vp, steps and the hyperparameters}

--precision bf16-mixed: the model's products as fourfold's bf16-mixed ones
(gpt_torch.GPT2's bf16): operands rounded to bf16, the arithmetic in --dtype;
attention's products too unless --attention fp32.

Formats are described in gpt_torch.py.
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
    ap.add_argument("--precision", choices=["fp32", "bf16-mixed"], default="fp32")
    ap.add_argument("--attention", choices=["bf16", "fp32"], default="bf16",
                    help="bf16-mixed: attention's products on bf16 operands (fourfold's) "
                         "or in fp32 (the recipe before them; a check's foil)")
    ap.add_argument("--ff", default=None,
                    help="fourfold's dump directory: follow its trajectory")
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
    fdt = "<f8" if a.dtype == "float64" else "<f4"
    out = lambda name: os.path.join(a.out, name)  # noqa: E731
    model = gt.GPT2(cfg, tensors, dtype=dtype, bf16=a.precision == "bf16-mixed",
                    bf16_attention=a.attention == "bf16")
    opt = gt.make_optimizer(model, a.lr, a.wd, a.beta1, a.beta2, a.eps)

    def ff_file(name):
        """fourfold's tensors (float32 exactly; converted by the callers)."""
        try:
            c, t = gt.read_checkpoint(os.path.join(a.ff, name))
        except (OSError, ValueError) as e:
            sys.exit(f"gpt_oracle: {e}")
        if c != cfg:
            sys.exit(f"gpt_oracle: {name}: config {c} differs from the checkpoint's {cfg}")
        return t

    def dump_grads(s, logits):
        if s == 0:
            logits.detach().numpy().astype(fdt).tofile(out("oracle_logits.bin"))
        grads = {n: model.params[n].grad for n in gt.PARAM_NAMES}
        gt.write_checkpoint(out(f"oracle_grads_{s}.bin"), cfg, grads, dtype=fdt)

    losses, norms, lrs = [], [], []
    for s in range(a.steps):
        lr = gt.lr_at(s, a.steps, a.lr, a.warmup, a.min_lr_frac)
        sl = slice(s * B, (s + 1) * B)
        if a.ff is None:
            loss, norm, _ = gt.train_step(model, opt, tokens[sl], targets[sl], lr, a.clip,
                                          lambda lg, _l, s=s: dump_grads(s, lg))
        else:
            # the loss and gradients at fourfold's parameters before step s ...
            saved = {n: model.params[n].detach().clone() for n in gt.PARAM_NAMES}
            if s > 0:
                gt.set_params(model, ff_file(f"ff_params_{s}.bin"))
            for p in model.parameters():
                p.grad = None
            logits, lt = model.forward(tokens[sl], targets[sl])
            lt.backward()
            dump_grads(s, logits)
            loss = float(lt)
            # ... and torch's AdamW on fourfold's gradients, from its own state
            gt.set_params(model, saved)
            norm = gt.optimizer_step(model, opt, ff_file(f"ff_grads_{s}.bin"), lr, a.clip)
        losses.append(loss)
        norms.append(norm)
        lrs.append(lr)
        print(f"step {s:3d}  loss {loss:.12g}  grad_norm {norm:.9e}  lr {lr:.9e}")

    state = {"oracle_params.bin": {n: model.params[n] for n in gt.PARAM_NAMES},
             "oracle_adam_m.bin": gt.adamw_state(opt, model, "exp_avg"),
             "oracle_adam_v.bin": gt.adamw_state(opt, model, "exp_avg_sq")}
    for name, t in state.items():
        gt.write_checkpoint(out(name), cfg, t, dtype=fdt)
    res = {"loss": losses[0], "losses": losses, "grad_norms": norms, "lrs": lrs,
           "dtype": a.dtype, "trajectory": "own" if a.ff is None else "fourfold",
           "precision": a.precision, "attention": a.attention,
           "B": B, "T": T, "V": cfg["V"], "Vp": cfg["Vp"],
           "steps": a.steps, "lr": a.lr, "warmup": a.warmup,
           "min_lr_frac": a.min_lr_frac, "wd": a.wd, "beta1": a.beta1,
           "beta2": a.beta2, "eps": a.eps, "clip": a.clip}
    with open(out("oracle.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
