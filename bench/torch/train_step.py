#!/usr/bin/env python3
"""Training-step time of a small GPT-like transformer, for the hook-overhead benchmark.

  python3 bench/torch/train_step.py [--layers 6] [--d 512] [--seq 256] [--batch 16]
                                    [--warmup 10] [--steps 50] [--seed 0]
  python3 bench/torch/train_step.py --serve ...   # bench/pairs/pairs.py worker: "steps N"

Model: token + learned position embeddings, `layers` pre-norm blocks (8-head causal attention,
4x GELU MLP), tied-free LM head; AdamW, bf16 autocast, random tokens (fixed seed). After
`warmup` untimed steps (the caching allocator fills, cuBLAS picks its kernels), each of `steps`
steps is timed on the host: synchronize, perf_counter, step, synchronize, perf_counter. Prints
one JSON line: {"median_ms", "mean_ms", "min_ms", "p90_ms", "steps", "loss", "allocator",
"max_reserved_bytes", ...}. --serve: the warm-up steps, then each "steps steps=N" command runs
2 untimed steps and times N more the same way and answers {"value": their median ms, ...}. Exit 77 when there is no
CUDA GPU.
"""
import argparse
import json
import os
import statistics
import sys
import time

import worker


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve", action="store_true")
    args = ap.parse_args()

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("train_step.py: no CUDA GPU", file=sys.stderr)
        return 77
    torch.manual_seed(args.seed)

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.heads = heads

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            sh = lambda z: z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            a = F.scaled_dot_product_attention(sh(q), sh(k), sh(v), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(args.vocab, args.d)
            self.pos = nn.Parameter(torch.zeros(1, args.seq, args.d))
            self.blocks = nn.ModuleList([Block(args.d, args.heads) for _ in range(args.layers)])
            self.ln = nn.LayerNorm(args.d)
            self.head = nn.Linear(args.d, args.vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx) + self.pos[:, : idx.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)

    def step():
        idx = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), idx.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()

    def timed(steps=args.steps):
        times = []
        loss = None
        for _ in range(2):  # untimed: the worker may have been idle while the other side measured
            step()
        for _ in range(int(steps)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        s = sorted(times)
        return {
            "value": statistics.median(times),
            "median_ms": statistics.median(times),
            "mean_ms": statistics.fmean(times),
            "min_ms": s[0],
            "p90_ms": s[min(len(s) - 1, int(0.9 * len(s)))],
            "steps": int(steps),
            "loss": float(loss.item()),
            "unit": "ms",
        }

    info = {
        "warmup": args.warmup,
        "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default") or "default",
        "hooked": "vlake-hook" in os.environ.get("LD_PRELOAD", ""),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    if args.serve:
        return worker.serve({"steps": lambda steps=args.steps: dict(timed(steps), max_reserved_bytes=torch.cuda.max_memory_reserved())}, info)
    out = dict(timed(), max_reserved_bytes=torch.cuda.max_memory_reserved(), **info)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
