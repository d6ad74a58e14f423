"""Alloc/free latency of one size through PyTorch with caching off (each tensor is a driver
allocation): prints JSON with p50/p99 in microseconds."""
import json
import sys
import time

import torch

size = int(sys.argv[1])
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 300
torch.zeros(1, device="cuda")
samples = []
for _ in range(iters + 20):
    t0 = time.perf_counter()
    x = torch.empty(size, dtype=torch.uint8, device="cuda")
    del x
    samples.append((time.perf_counter() - t0) * 1e6)
samples = sorted(samples[20:])
print(json.dumps({"size": size, "p50_us": samples[len(samples) // 2],
                  "p99_us": samples[int(len(samples) * 0.99) - 1]}))
