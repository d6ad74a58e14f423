#!/usr/bin/env python3
"""Records GPU allocation traces of real PyTorch workloads for vlake_bench_replay.

  python3 bench/traces/record.py [--out DIR] [--workloads train_ckpt,lora,infer_kv] [--quick]

Each workload runs under torch.cuda.memory._record_memory_history; the snapshot's trace is
converted to bench/traces/<name>.trace (docs/benchmarks.md, "Trace format"):

  # vlake-trace 1 workload=<name> torch=<version> gpu=<name> events=<n> peak_bytes=<n> ...
  <dt_us> alloc <id> <bytes>
  <dt_us> free <id>

dt_us is the time since the previous event (microseconds, from the snapshot's time_us).
Events are block-level: every tensor allocation the caching allocator hands out ("alloc") and
its completed free ("free_completed") - what the pool would see with the caching allocator
off (every block a cudaMalloc/cudaFree). Sizes are the allocator's block sizes (multiples of
512 B). Blocks still live when the recording stops get no free line (the replay frees them).
Needs a CUDA GPU and PyTorch >= 2.1; each file is kept under --max-bytes (default 1.9 MB) by
cutting events from the end (and then pairing).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask=None):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=8192, d=512, layers=6, heads=8, seq=256, recompute=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.recompute = recompute

    def forward(self, idx):
        t = idx.shape[1]
        x = self.emb(idx) + self.pos[:, :t]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), 1)
        for b in self.blocks:
            if self.recompute and self.training:
                x = ckpt.checkpoint(b, x, mask, use_reentrant=False)
            else:
                x = b(x, mask)
        return self.head(self.ln(x))


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank adapter (B @ A), LoRA-style."""

    def __init__(self, base, rank=8, alpha=16):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features, device=base.weight.device) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale


def add_lora(model):
    for blk in model.blocks:
        seq = blk.mlp
        seq[0] = LoRALinear(seq[0])
        seq[2] = LoRALinear(seq[2])
    for p in model.emb.parameters():
        p.requires_grad_(False)
    model.pos.requires_grad_(False)
    for p in model.head.parameters():
        p.requires_grad_(False)
    for blk in model.blocks:
        for p in list(blk.attn.parameters()) + list(blk.ln1.parameters()) + list(blk.ln2.parameters()):
            p.requires_grad_(False)


def train(model, steps, batch, seq, vocab):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for _ in range(steps):
        idx = torch.randint(0, vocab, (batch, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, vocab), idx.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def wl_train_ckpt(q):
    steps = 2 if q else 4
    model = GPT(layers=6, recompute=True).cuda()
    train(model, steps, batch=16, seq=256, vocab=8192)


def wl_lora(q):
    steps = 2 if q else 4
    model = GPT(layers=6).cuda()
    add_lora(model)
    train(model, steps, batch=16, seq=256, vocab=8192)


@torch.no_grad()
def wl_infer_kv(q):
    """Generate-like loop: a prompt, then one token at a time with a per-layer KV cache that
    grows by concatenation (each step allocates the bigger cache and frees the old one)."""
    d, heads, layers, vocab = 512, 8, 6, 8192
    batch, prompt, new = 8, 64, (48 if q else 160)
    model = GPT(vocab=vocab, d=d, layers=layers, heads=heads, seq=prompt + new).cuda().eval()
    idx = torch.randint(0, vocab, (batch, prompt), device="cuda")
    caches = [None] * layers
    x_all = idx
    for step in range(new):
        cur = x_all if step == 0 else x_all[:, -1:]
        t0 = x_all.shape[1] - cur.shape[1]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = model.emb(cur) + model.pos[:, t0:t0 + cur.shape[1]]
            for i, blk in enumerate(model.blocks):
                h = blk.ln1(x)
                qkv = F.linear(h, blk.attn.in_proj_weight, blk.attn.in_proj_bias)
                qq, k, v = qkv.split(d, dim=-1)
                kv = torch.stack([k, v])
                caches[i] = kv if caches[i] is None else torch.cat([caches[i], kv], dim=2)
                k_all, v_all = caches[i][0], caches[i][1]
                b, tq, _ = qq.shape
                qh = qq.view(b, tq, heads, d // heads).transpose(1, 2)
                kh = k_all.view(b, -1, heads, d // heads).transpose(1, 2)
                vh = v_all.view(b, -1, heads, d // heads).transpose(1, 2)
                a = F.scaled_dot_product_attention(qh, kh, vh, is_causal=(step == 0))
                a = a.transpose(1, 2).reshape(b, tq, d)
                x = x + F.linear(a, blk.attn.out_proj.weight, blk.attn.out_proj.bias)
                x = x + blk.mlp(blk.ln2(x))
            logits = model.head(model.ln(x[:, -1]))
        nxt = logits.float().argmax(-1, keepdim=True)
        x_all = torch.cat([x_all, nxt], dim=1)
    torch.cuda.synchronize()


WORKLOADS = {"train_ckpt": wl_train_ckpt, "lora": wl_lora, "infer_kv": wl_infer_kv}


def start_recording():
    try:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=2_000_000)
    except TypeError:  # older signature
        torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=2_000_000,
                                                 trace_alloc_record_context=False)


def stop_recording():
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except TypeError:
        torch.cuda.memory._record_memory_history(False)


def convert(trace):
    """Snapshot trace entries -> [(time_us, 'alloc', id, bytes) | (time_us, 'free', id)]."""
    events = []
    live = {}  # addr -> id
    next_id = 0
    segments = 0
    for e in trace:
        act = e.get("action")
        t = int(e.get("time_us", 0) or 0)
        if act == "alloc":
            live[e["addr"]] = next_id
            events.append((t, "alloc", next_id, int(e["size"])))
            next_id += 1
        elif act == "free_completed":
            i = live.pop(e["addr"], None)
            if i is not None:
                events.append((t, "free", i))
        elif act in ("segment_alloc", "segment_map"):
            segments += 1
    return events, segments


def render(name, events, meta, max_bytes):
    def body(evs):
        lines = []
        prev = evs[0][0] if evs else 0
        for ev in evs:
            dt = max(0, ev[0] - prev)
            prev = ev[0]
            lines.append("%d alloc %d %d" % (dt, ev[2], ev[3]) if ev[1] == "alloc" else "%d free %d" % (dt, ev[2]))
        return "\n".join(lines) + "\n"

    evs = events
    text = body(evs)
    while len(text) > max_bytes and len(evs) > 10:
        evs = evs[: int(len(evs) * max_bytes / len(text) * 0.97)]
        # a free whose alloc was cut cannot occur (frees follow their allocs); keep as is
        text = body(evs)
    live, peak, total = {}, 0, 0
    for ev in evs:
        if ev[1] == "alloc":
            live[ev[2]] = ev[3]
            total += ev[3]
            peak = max(peak, total)
        else:
            total -= live.pop(ev[2], 0)
    n_alloc = sum(1 for ev in evs if ev[1] == "alloc")
    dur = (evs[-1][0] - evs[0][0]) if evs else 0
    head = ("# vlake-trace 1 workload=%s torch=%s gpu=%s events=%d allocs=%d peak_bytes=%d duration_us=%d %s\n"
            % (name, torch.__version__, meta["gpu"].replace(" ", "_"), len(evs), n_alloc, peak, dur,
               " ".join("%s=%s" % kv for kv in meta.get("extra", {}).items())))
    return head + text, {"events": len(evs), "allocs": n_alloc, "peak_bytes": peak, "duration_us": dur}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-bytes", type=int, default=1_900_000)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("record.py: no CUDA GPU", file=sys.stderr)
        return 77
    os.makedirs(args.out, exist_ok=True)
    gpu = torch.cuda.get_device_name(0)
    summary = {}
    for name in args.workloads.split(","):
        torch.manual_seed(0)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        start_recording()
        t0 = time.time()
        WORKLOADS[name](args.quick)
        wall = time.time() - t0
        snap = torch.cuda.memory._snapshot()
        stop_recording()
        trace = snap["device_traces"][0] if snap.get("device_traces") else []
        events, segments = convert(trace)
        meta = {"gpu": gpu, "extra": {"segments": segments,
                                      "torch_peak_allocated": torch.cuda.max_memory_allocated()}}
        text, info = render(name, events, meta, args.max_bytes)
        path = os.path.join(args.out, name + ".trace")
        with open(path, "w") as f:
            f.write(text)
        info.update(file=path, file_bytes=len(text), wall_s=round(wall, 2), segments=segments,
                    torch_peak_allocated=torch.cuda.max_memory_allocated())
        summary[name] = info
        print(json.dumps({name: info}), flush=True)
        torch.cuda.empty_cache()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
