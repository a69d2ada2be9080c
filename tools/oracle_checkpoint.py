#!/usr/bin/python3
"""A checkpoint and token shard written by PyTorch, for fourfold to load
(run with /usr/bin/python3, which has torch).

  oracle_checkpoint.py DIR [--seqs 8] [--seq 32] [--seed 5]

Writes DIR/torch_model.bin (llm.c gpt2_*.bin v3, fp32, with the layout of
llm.c's fill_in_parameter_sizes and no fourfold checksum, as llm.c writes it),
DIR/torch_tokens.bin (an llm.c token shard: magic 20240520, version 1,
seqs*seq + 1 uint16 tokens) and prints the mean loss of the model on the
shard's first window (sequence s: tokens [s*seq, s*seq + seq), targets
shifted by one), computed by the PyTorch model of gpt_torch.py in float64:
the number `fourfold eval --batch SEQS --seq SEQ` must reproduce.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch as gt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    cfg = {"maxT": a.seq, "V": 257, "L": 2, "NH": 4, "C": 64}
    cfg["Vp"] = gt.padded_vocab(cfg["V"])
    params = gt.random_params(cfg, seed=a.seed, std=0.05)
    os.makedirs(a.dir, exist_ok=True)
    gt.write_checkpoint(os.path.join(a.dir, "torch_model.bin"), cfg, params)

    n = a.seqs * a.seq + 1
    tokens = np.random.default_rng(a.seed + 1).integers(0, cfg["V"], size=n)
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    with open(os.path.join(a.dir, "torch_tokens.bin"), "wb") as f:
        f.write(hdr.tobytes())
        f.write(tokens.astype("<u2").tobytes())

    x = torch.as_tensor(tokens[:-1].reshape(a.seqs, a.seq))
    y = torch.as_tensor(tokens[1:].reshape(a.seqs, a.seq))
    model = gt.GPT2(cfg, params, dtype=torch.float64)
    with torch.no_grad():
        _, loss = model.forward(x, y)
    print(f"{loss.item():.12g}")


if __name__ == "__main__":
    main()
