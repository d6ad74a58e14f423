"""One tenant's overrun: allocate a tensor, store one element past its end with a raw CUDA
kernel (CuPy, NVRTC), free it, synchronize. Prints JSON: what the program saw.

  poke.py ELEMENTS [--inside]   (--inside: write the last element instead: no overrun)
Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so the tensor is its own cuMemAlloc allocation.
"""
import json
import sys

import cupy
import torch

n = int(sys.argv[1])
inside = "--inside" in sys.argv
kernel = cupy.RawKernel(r'''
extern "C" __global__ void poke(float* p, unsigned long long i) { p[i] = 42.0f; }
''', "poke")
out = {"elements": n}
x = torch.zeros(n, dtype=torch.float32, device="cuda")
out["ptr"] = x.data_ptr()
try:
    kernel((1,), (1,), (cupy.uint64(x.data_ptr()), cupy.uint64(n - 1 if inside else n)))
    # A stream synchronization (cuStreamSynchronize) is where the fault surfaces.
    torch.cuda.current_stream().synchronize()
    del x
    torch.cuda.current_stream().synchronize()
    out["error"] = None
except RuntimeError as e:
    out["error"] = str(e).splitlines()[0][:200]
print(json.dumps(out), flush=True)
