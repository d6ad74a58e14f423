#!/usr/bin/env python3
"""Model load time: a safetensors checkpoint read to GPU 0 (docs/benchmarks.md, "Model load").

  python3 bench/torch/load.py --write FILE [--gib 4]   # writes the checkpoint (random fp16)
  python3 bench/torch/load.py --file FILE              # one load, printed as JSON
  python3 bench/torch/load.py --serve --file FILE      # bench/pairs/pairs.py worker: "load"

--write: `gib` GiB of fp16 tensors of 64 MiB each (names layer.<i>.weight: one random tensor from a
fixed seed, scaled by 1 + i/n) saved with safetensors. A load: safetensors.torch.load_file(FILE, device="cuda:0")
(every tensor allocated by PyTorch's caching allocator and copied from the file, which the
write left in the page cache), synchronize; then the tensors are dropped and the cache emptied
(torch.cuda.empty_cache), so that every load allocates its memory again from the driver (or
the hook), as a process that starts does. Prints {"value": seconds, "bytes", "tensors",
"gib_per_s"}. Exit 77 when there is no CUDA GPU or safetensors is missing.
"""
import argparse
import gc
import json
import os
import sys
import time

import worker

TENSOR_BYTES = 64 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", default="")
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--file", default="")
    ap.add_argument("--serve", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        import safetensors.torch as st
    except ImportError as e:
        print("load.py: %s" % e, file=sys.stderr)
        return 77
    if args.write:
        g = torch.Generator().manual_seed(0)
        n = max(1, int(args.gib * (1 << 30)) // TENSOR_BYTES)
        base = torch.randn(TENSOR_BYTES // 2, generator=g, dtype=torch.float32).half()
        tensors = {"layer.%d.weight" % i: base * (1 + i / n) for i in range(n)}
        tmp = args.write + ".tmp"
        st.save_file(tensors, tmp)
        os.replace(tmp, args.write)
        print(json.dumps({"written": args.write, "bytes": os.path.getsize(args.write), "tensors": n}), flush=True)
        return 0
    if not args.file:
        print("load.py: --file FILE (or --write FILE)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("load.py: no CUDA GPU", file=sys.stderr)
        return 77
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context exists before the first timed load

    def load():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sd = st.load_file(args.file, device="cuda:0")
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        n = len(sd)
        del sd
        gc.collect()
        torch.cuda.empty_cache()
        return {"value": secs, "bytes": nbytes, "tensors": n, "gib_per_s": nbytes / secs / (1 << 30), "unit": "s"}

    info = {"file_bytes": os.path.getsize(args.file), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    if args.serve:
        return worker.serve({"load": load}, info)
    print(json.dumps(dict(load(), **info)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
