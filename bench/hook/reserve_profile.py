#!/usr/bin/env python3
"""How real workloads reuse the hook's local reserve, for choosing VLAKE_RESERVE and
VLAKE_RESERVE_AGE from measurements (docs/hook.md, "Choosing the reserve's defaults").

Each workload runs once under libvlake-hook.so with a real vlaked, with a reserve that keeps
everything (VLAKE_RESERVE=64GiB, VLAKE_RESERVE_AGE=1h) and VLAKE_RESERVE_STATS set: the hook
records, for every warm reuse, how long the block was idle (gap) and the bytes freed at or after
it still in the reserve (its LRU stack distance: the smallest cap that would have kept it). So
one run tells, for any (age, cap), which share of the reuses those settings keep. A reuse the
reserve loses is not lost memory: it becomes a daemon grant served from vlaked's free pool (the
cold path, tens of microseconds instead of a few).

Prints, per workload: allocations on the alloc path, reuses, idle-gap percentiles (bucket upper
bounds), the share of reuses kept by each candidate age and cap, and the reserve's peak; then the
smallest age and cap that keep >= 99 % of the reuses of every workload. Exit 77 without a GPU.

  reserve_profile.py --vlaked PATH --hook PATH [--json OUT] [--only NAME,...]
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
import node_slice as ns  # noqa: E402

MiB = 1 << 20
AGES_S = [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30]
CAPS_MIB = [64, 128, 256, 512, 1024, 2048, 4096]
KEEP = 0.99

# Each workload: (name, description, env additions, python code). They run ~10-30 s each.
TRAIN = os.path.join(ROOT, "tests", "gpu", "train.py")
WORKLOADS = [
    ("torch_train", "PyTorch: small transformer, 60 training steps, default caching allocator",
     {}, None),
    ("torch_train_nocache", "the same with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor free reaches the driver)",
     {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, None),
    ("torch_serve", "PyTorch inference server: 200 requests of random batch and length, "
     "torch.cuda.empty_cache() after each, 0-50 ms between requests",
     {}, r"""
import random, time, torch
torch.manual_seed(0); random.seed(0)
layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True).cuda().half().eval()
with torch.no_grad():
    for i in range(200):
        b, n = random.choice([1, 2, 4, 8, 16]), random.choice([64, 128, 256, 512, 1024])
        x = torch.randn(b, n, 1024, device="cuda", dtype=torch.half)
        y = layer(layer(x)).float().sum().item()
        del x
        torch.cuda.empty_cache()
        time.sleep(random.random() * 0.05)
"""),
    ("cupy_nopool", "CuPy without its memory pool: FFTs, matmuls and reductions of varying sizes",
     {}, r"""
import random, cupy
cupy.cuda.set_allocator(None)
random.seed(0)
for i in range(400):
    n = random.choice([256, 512, 1024, 2048])
    a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
    b = a @ a.T
    f = cupy.fft.fft2(b)
    s = float(cupy.abs(f).sum())
    del a, b, f
cupy.cuda.Device().synchronize()
"""),
    ("jax_platform", "JAX with the platform allocator (XLA_PYTHON_CLIENT_ALLOCATOR=platform): "
     "an MLP trained for 300 steps",
     {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, r"""
import jax, jax.numpy as jnp
k = jax.random.PRNGKey(0)
ws = [jax.random.normal(k, (1024, 1024)) * 0.02 for _ in range(4)]
x = jax.random.normal(k, (512, 1024)); y = jax.random.normal(k, (512, 1024))
def loss(ws, x, y):
    h = x
    for w in ws: h = jnp.tanh(h @ w)
    return ((h - y) ** 2).mean()
step = jax.jit(lambda ws, x, y: [w - 0.01 * g for w, g in zip(ws, jax.grad(loss)(ws, x, y))])
for i in range(300):
    ws = step(ws, x, y)
jax.block_until_ready(ws)
"""),
]


def available(code):
    mod = "cupy" if "cupy" in code else "jax" if "jax" in code else "torch"
    r = subprocess.run([sys.executable, "-c", "import %s" % mod], capture_output=True, timeout=120)
    return r.returncode == 0


def load(prefix):
    """Merges the statistics files of every process of one workload."""
    files = glob.glob(prefix + ".*.json")
    merged = None
    for f in files:
        d = json.load(open(f))
        if merged is None:
            merged = d
            merged["reuses"] = {(g, s): c for g, s, c in d["reuses"]}
            continue
        for k, v in d.items():
            if k == "reuses":
                for g, s, c in v:
                    merged["reuses"][(g, s)] = merged["reuses"].get((g, s), 0) + c
            elif k == "peak_bytes":
                merged[k] = max(merged[k], v)
            elif isinstance(v, int) and k not in ("reserve_cap", "reserve_age_ms"):
                merged[k] += v
    return merged, len(files)


def summarize(d):
    cells = d["reuses"]
    gap_up = d["gap_ms_upper"]
    stack_up = d["stack_mib_upper"]
    n = sum(cells.values())

    def kept(age_ms=None, cap_mib=None):
        # A reuse survives age A when its gap bucket's upper bound is <= A (conservative: the
        # whole bucket is below A) and cap C when its stack bucket's upper bound is <= C.
        k = 0
        for (g, s), c in cells.items():
            if age_ms is not None and gap_up[g] > age_ms:
                continue
            if cap_mib is not None and stack_up[s] > cap_mib:
                continue
            k += c
        return k / n if n else 1.0

    def gap_pct(p):
        if not n:
            return None
        acc = 0
        for g in range(len(gap_up)):
            acc += sum(c for (gg, s), c in cells.items() if gg == g)
            if acc >= p * n:
                return gap_up[g]
        return gap_up[-1]

    return {
        "reuses": n,
        "allocations": n + d["misses"],
        "hit_rate": n / (n + d["misses"]) if n + d["misses"] else 0.0,
        "gap_ms_p50": gap_pct(0.5), "gap_ms_p90": gap_pct(0.9), "gap_ms_p99": gap_pct(0.99),
        "gap_ms_max": gap_pct(1.0),
        "kept_by_age": {str(a): kept(age_ms=a * 1000) for a in AGES_S},
        "kept_by_cap": {str(c): kept(cap_mib=c) for c in CAPS_MIB},
        "peak_mib": d["peak_bytes"] / MiB,
        "drained": d["drained"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vlaked", required=True)
    ap.add_argument("--hook", required=True)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--only", help="comma-separated workload names")
    args = ap.parse_args()
    if not ns.gpu_present():
        print("skipped: no GPU or no PyTorch")
        return 77
    work = tempfile.mkdtemp(prefix="vlake-reserve-profile-")
    results = {}
    daemon = None
    try:
        daemon = ns.Daemon(args.vlaked, work, "version: 1\ndefault:\n  limit: 100%\n")
        only = set(args.only.split(",")) if args.only else None
        for name, what, extra, code in WORKLOADS:
            if only and name not in only:
                continue
            cmd = [sys.executable, TRAIN] if code is None else [sys.executable, "-c", code]
            if code is not None and not available(code):
                print("%s: skipped (module missing)" % name, file=sys.stderr)
                continue
            prefix = os.path.join(work, name)
            env = dict(os.environ, LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock, VLAKE_RESERVE="64GiB",
                       VLAKE_RESERVE_AGE="3600s", VLAKE_RESERVE_STATS=prefix, **extra)
            t0 = time.monotonic()
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            took = time.monotonic() - t0
            if p.returncode != 0:
                print("%s: exit %d\n%s" % (name, p.returncode, p.stderr[-2000:]), file=sys.stderr)
                results[name] = {"what": what, "error": "exit %d" % p.returncode}
                continue
            d, procs = load(prefix)
            if d is None:
                results[name] = {"what": what, "error": "no statistics written"}
                continue
            r = summarize(d)
            r.update(what=what, seconds=round(took, 1), processes=procs)
            results[name] = r
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)

    ok = {k: v for k, v in results.items() if "error" not in v}
    print("%-20s %8s %8s %6s %8s %8s %8s %8s %8s" % ("workload", "allocs", "reuses", "hit%", "gap p50", "gap p90",
                                                     "gap p99", "gap max", "peak MiB"))
    for k, v in results.items():
        if "error" in v:
            print("%-20s %s" % (k, v["error"]))
            continue
        fmt = lambda ms: "-" if ms is None else ("<%gms" % ms if ms < 1000 else "<%gs" % (ms / 1000))
        print("%-20s %8d %8d %6.1f %8s %8s %8s %8s %8.0f" % (
            k, v["allocations"], v["reuses"], 100 * v["hit_rate"], fmt(v["gap_ms_p50"]), fmt(v["gap_ms_p90"]),
            fmt(v["gap_ms_p99"]), fmt(v["gap_ms_max"]), v["peak_mib"]))
    print("\nshare of reuses kept by VLAKE_RESERVE_AGE (cap unlimited)")
    print("%-20s " % "workload" + " ".join("%7gs" % a for a in AGES_S))
    for k, v in ok.items():
        print("%-20s " % k + " ".join("%7.1f%%" % (100 * v["kept_by_age"][str(a)]) for a in AGES_S))
    print("\nshare of reuses kept by VLAKE_RESERVE (age unlimited)")
    print("%-20s " % "workload" + " ".join("%7dM" % c for c in CAPS_MIB))
    for k, v in ok.items():
        print("%-20s " % k + " ".join("%7.1f%%" % (100 * v["kept_by_cap"][str(c)]) for c in CAPS_MIB))
    busy = {k: v for k, v in ok.items() if v["reuses"] >= 100}
    age = next((a for a in AGES_S if all(v["kept_by_age"][str(a)] >= KEEP for v in busy.values())), None)
    cap = next((c for c in CAPS_MIB if all(v["kept_by_cap"][str(c)] >= KEEP for v in busy.values())), None)
    print("\nsmallest settings keeping >= %d %% of the reuses of every workload with >= 100 reuses (%s): "
          "age %s, cap %s" % (KEEP * 100, ", ".join(busy) or "none",
                              "%gs" % age if age is not None else "none of the candidates",
                              "%dMiB" % cap if cap is not None else "none of the candidates"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workloads": results, "age_s": age, "cap_mib": cap, "keep": KEEP}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
