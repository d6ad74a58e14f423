"""Allocates past the tenant's limit and reports how PyTorch saw it (JSON on stdout)."""
import json
import sys

import torch

limit = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
result = {"mem_get_info": [free, total]}
try:
    x = torch.empty(limit + (1 << 30), dtype=torch.uint8, device="cuda")
    result["error"] = None
except torch.OutOfMemoryError as e:  # the class PyTorch raises for CUDA OOM
    result["error"] = type(e).__name__
    result["message"] = str(e).splitlines()[0][:300]
# A request inside the limit still works afterwards.
y = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
result["after"] = int(y.sum().item())
print(json.dumps(result))
