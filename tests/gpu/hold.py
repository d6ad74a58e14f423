"""Holds N MiB of GPU memory until stdin closes; prints its pid and mem_get_info when ready."""
import json
import os
import sys

import torch

mib = int(sys.argv[1])
x = torch.ones(mib << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(json.dumps({"pid": os.getpid(), "mem_get_info": [free, total], "sum": int(x[:1024].sum())}), flush=True)
sys.stdin.read()
