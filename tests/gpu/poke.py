"""One tenant's overrun: allocate a tensor, store one element past its end with a raw CUDA
kernel (CuPy, NVRTC), free it, synchronize. Prints JSON: what the program saw.

  poke.py ELEMENTS [--inside] [--device-sync]
    --inside: write the last element instead (no overrun)
    --device-sync: wait with torch.cuda.synchronize() (cudaDeviceSynchronize) rather than a
                   stream synchronization
Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so the tensor is its own cuMemAlloc allocation.
"""
import json
import sys

import cupy
import torch

n = int(sys.argv[1])
inside = "--inside" in sys.argv
sync = torch.cuda.synchronize if "--device-sync" in sys.argv else lambda: torch.cuda.current_stream().synchronize()
kernel = cupy.RawKernel(r'''
extern "C" __global__ void poke(float* p, unsigned long long i) { p[i] = 42.0f; }
''', "poke")
out = {"elements": n}
x = torch.zeros(n, dtype=torch.float32, device="cuda")
out["ptr"] = x.data_ptr()
try:
    kernel((1,), (1,), (cupy.uint64(x.data_ptr()), cupy.uint64(n - 1 if inside else n)))
    # The synchronization is where the fault surfaces.
    sync()
    del x
    sync()
    out["error"] = None
except RuntimeError as e:
    out["error"] = str(e).splitlines()[0][:200]
print(json.dumps(out), flush=True)
