#!/usr/bin/env python3
"""The compatibility matrix (docs/compat.md): one row = one framework in one mode under the hook,
with a real vlaked on the real driver. Each row:
  1. runs the workload without the hook (reference) where its results can be compared;
  2. starts vlaked with a quota file (this user's tenant limited to 4 GiB per GPU, 2 GiB for the
     bypass rows), runs the workload under the hook and compares its results with the reference;
  3. while the workload holds its memory: vlakectl --json shows the tenant charged at least what
     the framework says it holds and at most its limit, and NVML's used memory of each GPU equals
     the daemon's accounting (Checks.reconcile: tenants + unbound free pool + daemon context)
     within 64 MiB, so nothing is held that the daemon does not count;
  4. an allocation past the limit fails with the framework's own out-of-memory error, and a
     small one afterwards works.
The "gpu.bypass.*" rows are tenants calling the driver themselves (ctypes) where memory could
escape the quota: they must be refused with CUDA_ERROR_OUT_OF_MEMORY (2) or be charged.
Exit 0 if every check passed, 1 otherwise, 77 (skipped, one line why) without the GPU, the
framework, or a second GPU for 2-GPU rows. One JSON line per mode goes to --results.

  compat.py --row NAME --vlaked PATH --hook PATH --state-tool PATH --vlakectl PATH
            [--results FILE] [--keep]
  compat.py --list
"""
import argparse
import datetime
import importlib.util
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checks import Checks, testprocs  # noqa: E402
import node_slice as ns  # noqa: E402  (Daemon, state_json)

MiB = 1 << 20
GiB = 1 << 30
SKIP = 77
WORK = os.path.join(HERE, "compat_work.py")
SLACK = 64 * MiB

check = Checks()


class Skip(Exception):
    pass


# ------------------------------------------------------------------------------- the processes
class Proc:
    """One workload process: stdout lines read by a thread, "@@ " lines parsed as JSON."""

    def __init__(self, argv, env, work, tag):
        self.err_path = os.path.join(work, "%s.stderr" % tag)
        self.err = open(self.err_path, "w")
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                  text=True)
        self.lines = queue.Queue()
        self.out = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.out.append(line)
            if line.startswith("@@ "):
                self.lines.put(json.loads(line[3:]))
        self.lines.put(None)

    def next(self, timeout):
        """The next protocol message; None once the process ended without one."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return {"timeout": timeout}

    def go(self):
        try:
            self.p.stdin.write("go\n")
            self.p.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def finish(self, timeout=120):
        testprocs.end(self.p, timeout)
        self.err.close()

    def tail(self, n=800):
        with open(self.err_path, errors="replace") as f:
            text = f.read()
        return ("stdout: " + "".join(self.out)[-300:] + " | stderr: " + text[-n:]).replace("\n", " / ")


def gpu_count():
    """How many GPUs NVML sees (0 without NVML)."""
    import ctypes
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        n = ctypes.c_uint(0)
        if lib.nvmlInit_v2() != 0 or lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) != 0:
            return 0
        return n.value
    except OSError:
        return 0


# ---------------------------------------------------------------------------------- one context
class Ctx:
    def __init__(self, args, row, work):
        self.args, self.row, self.work = args, row, work
        self.limit = row.limit
        self.base = dict(os.environ, PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=":4096:8", HF_HUB_OFFLINE="1",
                         TRANSFORMERS_OFFLINE="1", NCCL_DEBUG="WARN")
        self.daemon = None
        self.records = []  # the JSON lines for --results
        self.count = 0

    # -- reference run, without the hook
    def reference(self, cmds, extra_env=None, timeout=300):
        """Runs the workload processes without the hook; their results (a skip raises Skip)."""
        env = dict(self.base, **(extra_env or {}))
        env.pop("LD_PRELOAD", None)
        procs = [self._start(c + ["--reference", "--limit", str(self.limit)], env, "ref") for c in cmds]
        results = []
        for p in procs:
            msg = p.next(timeout)
            if msg and "skip" in msg:
                for q in procs:
                    q.finish(10)
                raise Skip(msg["skip"])
            results.append(msg.get("result") if msg else None)
        for p in procs:
            p.finish()
        for p, r in zip(procs, results):
            if r is None:
                check("%s: reference run without the hook" % self.row.name, False, p.tail())
        return results

    def _start(self, cmd, env, tag):
        self.count += 1
        return Proc(cmd, env, self.work, "%s-%d" % (tag, self.count))

    # -- the daemon
    def start_daemon(self):
        config = "version: 1\ndefault:\n  limit: %dMiB\n" % (self.limit // MiB)
        self.daemon = ns.Daemon(self.args.vlaked, self.work, config, ("--sample-interval-ms", "200"))
        return dict(self.base, LD_PRELOAD=self.args.hook, VLAKE_SOCKET=self.daemon.sock)

    def stop_daemon(self):
        if self.daemon:
            self.daemon.stop()
            if check.any_failed():
                with open(self.daemon.log.name, errors="replace") as f:
                    print("---- vlaked log (tail) ----\n" + "".join(f.readlines()[-30:]))
            self.daemon = None

    def tenant(self):
        """This user's tenant in `vlakectl tenants --json` (per GPU: used, granted, limit)."""
        p = subprocess.run([self.args.vlakectl, "--state", self.daemon.state, "tenants", "--json"],
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            return None, "vlakectl: " + p.stderr.strip()
        doc = json.loads(p.stdout)
        mine = [t for t in doc["tenants"] if any(s["uid"] == os.getuid() for s in t.get("sessions", []))]
        if not mine:
            named = [t for t in doc["tenants"] if t["name"] in ("uid:%d" % os.getuid(), "user:root")]
            mine = named
        return (mine[0] if mine else None), json.dumps(doc["tenants"])[:600]

    # -- the hooked run
    def hooked(self, label, cmds, env, gpus=(0,), timeout=300, limit_arg=True):
        """Runs the workload processes under the hook (with --limit unless `limit_arg` is
        false); at each "holding" the accounting checks (charged, within the limit, reconciled
        with NVML); the processes' results."""
        from nvml import Nvml
        procs = [self._start(c + (["--limit", str(self.limit)] if limit_arg else []), env, "hooked") for c in cmds]
        self.last = procs
        snapshots = []  # (stage, state, {gpu: nvml used}, {gpu: held})
        results = [None] * len(procs)
        done = [False] * len(procs)
        silent = set()  # processes already reported as not answering
        try:
            while not all(done):
                held, stage = {}, None
                for i, p in enumerate(procs):
                    if done[i]:
                        continue
                    msg = p.next(timeout)
                    if msg is None:
                        try:
                            p.p.wait(timeout=10)
                        except subprocess.TimeoutExpired:
                            pass
                    if msg is None or "timeout" in msg:
                        check("%s: the workload answers" % label, False,
                              ("no message in %d s; " % timeout if msg else "exited %s; " % p.p.poll()) + p.tail())
                        done[i] = True
                        silent.add(i)
                    elif "skip" in msg:
                        raise Skip(msg["skip"])
                    elif "result" in msg:
                        results[i] = msg["result"]
                        done[i] = True
                    else:
                        info = msg["holding"]
                        gpu = info.get("gpu", 0)
                        held[gpu] = held.get(gpu, 0) + info.get("held", 0)
                        stage = info.get("stage", stage)
                if held or stage:
                    time.sleep(1.2)  # several of the daemon's NVML sampling intervals (200 ms)
                    st = ns.state_json(self.args.state_tool, self.daemon.state)
                    used = {g: Nvml(g).memory()["used"] for g in gpus}
                    tenant, raw = self.tenant()
                    snapshots.append((stage or "holding", st, used, held))
                    self._charged(label, stage, tenant, raw, held, gpus)
                    if tenant:  # for the record: what NVML lists for the tenant's own processes
                        for g in gpus:
                            listed = Nvml(g).processes()
                            mine = sum(listed.get(pid, 0) for pid in tenant.get("pids", []))
                            e = [x for x in tenant["gpus"] if x["index"] == g] or [{}]
                            print("INFO %s GPU %d: NVML lists %.1f MiB for the tenant's processes %s; vlakectl: "
                                  "used %.1f, granted %.1f, non-pool %.1f MiB"
                                  % (label, g, mine / MiB, tenant.get("pids"), e[0].get("used", 0) / MiB,
                                     e[0].get("granted", 0) / MiB, e[0].get("nonpool", 0) / MiB), flush=True)
                    for i, p in enumerate(procs):
                        if not done[i]:
                            p.go()
        finally:
            for p in procs:
                p.finish()
        for i, (p, r) in enumerate(zip(procs, results)):
            if r is None and i not in silent:
                check("%s: the workload ran to its end" % label, False, p.tail())
        # The daemon's own context once the tenants left: its NVML figure less its pool.
        time.sleep(1.2)
        idle = ns.state_json(self.args.state_tool, self.daemon.state)
        for stage, st, used, _ in snapshots:
            for g in gpus:
                dev = [d for d in idle["devices"] if d["ordinal"] == g]
                context = Nvml(g).processes().get(self.daemon.proc.pid, 0) - (dev[0]["pool_bytes"] if dev else 0)
                check.reconcile("%s: NVML used = daemon accounting within 64 MiB (GPU %d, %s)" % (label, g, stage),
                                st, used[g], context, gpu=g)
        return results

    def _charged(self, label, stage, tenant, raw, held, gpus):
        where = " (%s)" % stage if stage else ""
        if not check("%s: the tenant is listed by vlakectl --json%s" % (label, where), tenant is not None, raw):
            return
        for g in gpus:
            e = [x for x in tenant["gpus"] if x["index"] == g]
            if not e:
                check("%s: vlakectl --json has GPU %d" % (label, g), False, raw)
                continue
            e = e[0]
            want = held.get(g, 0)
            check("%s: charged >= held by the framework, <= limit (GPU %d)%s" % (label, g, where),
                  e["used"] + SLACK >= want and e["used"] <= e["limit"] + SLACK and e["limit"] == self.limit,
                  "vlakectl used %.1f MiB (granted %.1f, non-pool %.1f), limit %.1f MiB; the framework holds %.1f MiB"
                  % (e["used"] / MiB, e["granted"] / MiB, e["nonpool"] / MiB, e["limit"] / MiB, want / MiB))

    def oom(self, label, result, expected):
        o = (result or {}).get("oom") or {}
        check("%s: past the limit: %s, then a small allocation works" % (label, expected),
              o.get("error") == expected and o.get("after") is True,
              "got %s (%s), afterwards %s" % (o.get("error"), o.get("message", ""), o.get("after")))

    def record(self, mode, framework, version, start, numbers=None):
        ok = not any(not r[1] for r in check.results[start:])
        self.records.append({"row": self.row.name, "framework": framework, "version": version, "mode": mode,
                             "result": "pass" if ok else "FAIL", "numbers": numbers or {},
                             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                             "device": self.row.device})


def same(a, b, rel=0.0):
    """Equal lists/numbers; rel > 0: within that relative tolerance."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b if rel == 0 else abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)
    return a == b


def work(name, *opts):
    return [sys.executable, WORK, name] + list(opts)


# -------------------------------------------------------------------------------------- the rows
def torch_train(ctx, mode, alloc_conf):
    extra = {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if alloc_conf else {}
    start = len(check.results)
    (ref,) = ctx.reference([work("train")], extra)
    env = dict(ctx.start_daemon(), **extra)
    (got,) = ctx.hooked(ctx.row.name, [work("train")], env)
    if ref and got:
        check("%s: losses equal the run without the hook" % ctx.row.name, got["losses"] == ref["losses"],
              "first/last with hook %s/%s, without %s/%s" % (got["losses"][0], got["losses"][-1], ref["losses"][0],
                                                            ref["losses"][-1]))
        check("%s: mem_get_info shows the limit" % ctx.row.name, got["mem_get_info"][1] == ctx.limit,
              "total %d, limit %d" % (got["mem_get_info"][1], ctx.limit))
    ctx.oom(ctx.row.name, got, "torch.OutOfMemoryError")
    ctx.record(mode, "PyTorch", (got or ref or {}).get("version"), start)


def row_torch_default(ctx):
    torch_train(ctx, "default caching allocator", None)


def row_torch_expandable(ctx):
    torch_train(ctx, "expandable_segments:True", "expandable_segments:True")


def row_torch_async(ctx):
    torch_train(ctx, "backend:cudaMallocAsync", "backend:cudaMallocAsync")


def row_torch_graphs(ctx):
    modes = (("graphs, default allocator", {}),
             ("graphs, cudaMallocAsync (graph memory nodes)", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}))
    refs = [ctx.reference([work("graphs")], extra)[0] for _, extra in modes]  # before the daemon starts
    env = ctx.start_daemon()
    for (mode, extra), ref in zip(modes, refs):
        start = len(check.results)
        label = "%s [%s]" % (ctx.row.name, mode)
        (got,) = ctx.hooked(label, [work("graphs")], dict(env, **extra))
        if got:
            check("%s: replays equal eager runs" % label, got["max_diff"] <= 1e-5, "max |diff| %g" % got["max_diff"])
            check("%s: allocator backend" % label, got["allocator"] == ("cudaMallocAsync" if extra else "native"),
                  got["allocator"])
        if ref and got:
            check("%s: replay outputs equal the run without the hook" % label, same(got["sums"], ref["sums"], 1e-6),
                  "with %s, without %s" % (got["sums"], ref["sums"]))
        ctx.oom(label, got, "torch.OutOfMemoryError")
        ctx.record(mode, "PyTorch", (got or ref or {}).get("version"), start, {"max_diff": got and got["max_diff"]})


def row_torch_mp_ipc(ctx):
    start = len(check.results)
    ctx.reference([work("mp_ipc")])
    (got,) = ctx.hooked(ctx.row.name, [work("mp_ipc")], ctx.start_daemon())
    if got:
        check("%s: the producer sees the consumer's in-place write" % ctx.row.name, got["producer_sees_write"] is True,
              json.dumps(got)[:300])
        check("%s: the consumer exits cleanly" % ctx.row.name, got["consumer_exit"] == 0, str(got["consumer_exit"]))
    ctx.oom(ctx.row.name, got, "torch.OutOfMemoryError")
    ctx.record("spawn, Queue, interprocess event", "PyTorch", (got or {}).get("version"), start)


def row_torch_dataloader(ctx):
    start = len(check.results)
    (ref,) = ctx.reference([work("dataloader")])
    (got,) = ctx.hooked(ctx.row.name, [work("dataloader")], ctx.start_daemon())
    if got:
        check("%s: batches arrive pinned" % ctx.row.name, got["pinned"] is True)
    if ref and got:
        check("%s: losses equal the run without the hook" % ctx.row.name, got["losses"] == ref["losses"],
              "last with hook %s, without %s" % (got["losses"][-1], ref["losses"][-1]))
    ctx.oom(ctx.row.name, got, "torch.OutOfMemoryError")
    ctx.record("num_workers=2, pin_memory=True", "PyTorch", (got or ref or {}).get("version"), start)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def row_torch_nccl(ctx):
    start = len(check.results)
    ranks = lambda port: [work("nccl", "--rank", str(r), "--world", "2", "--port", str(port)) for r in (0, 1)]  # noqa
    ref = ctx.reference(ranks(free_port()))
    got = ctx.hooked(ctx.row.name, ranks(free_port()), ctx.start_daemon(), gpus=(0, 1))
    native = min(r["busbw_GBps"] for r in ref if r) if all(ref) else None
    hooked = min(r["busbw_GBps"] for r in got if r) if all(got) else None
    if all(got):
        check("%s: all-reduce exact on both ranks" % ctx.row.name, all(r["exact"] for r in got),
              json.dumps([r["exact"] for r in got]))
    if all(ref) and all(got):
        check("%s: results equal the run without the hook" % ctx.row.name,
              [r["checksum"] for r in got] == [r["checksum"] for r in ref],
              "with %s, without %s" % ([r["checksum"] for r in got], [r["checksum"] for r in ref]))
        check("%s: bus bandwidth within 3 %% of native (256 MiB all-reduce)" % ctx.row.name, hooked >= 0.97 * native,
              "busbw with the hook %.2f GB/s, without %.2f GB/s (%.1f %%)" % (hooked, native,
                                                                            100.0 * hooked / native))
    for r, res in enumerate(got):
        ctx.oom("%s rank %d (GPU %d)" % (ctx.row.name, r, r), res, "torch.OutOfMemoryError")
    print("NCCL all-reduce 256 MiB busbw: with the hook %s GB/s, without %s GB/s" % (hooked, native))
    v = got[0] if got and got[0] else (ref[0] if ref and ref[0] else {})
    ctx.record("2 GPUs, NCCL all-reduce", "PyTorch", v.get("version") and "%s, NCCL %s" % (v["version"], v["nccl"]),
               start, {"busbw_GBps_hook": hooked, "busbw_GBps_native": native,
                       "ratio": round(hooked / native, 4) if hooked and native else None})


def jax_row(ctx, mode, extra):
    start = len(check.results)
    (ref,) = ctx.reference([work("jax")], extra)
    (got,) = ctx.hooked(ctx.row.name, [work("jax")], dict(ctx.start_daemon(), **extra))
    if ref and got:
        check("%s: losses equal the run without the hook (rel 1e-6)" % ctx.row.name,
              same(got["losses"], ref["losses"], 1e-6), "with %s, without %s" % (got["losses"][-1], ref["losses"][-1]))
    if got:
        o = got.get("oom") or {}
        check("%s: past the limit: RESOURCE_EXHAUSTED, then a small allocation works" % ctx.row.name,
              "RESOURCE_EXHAUSTED" in (o.get("error") or "") and o.get("after") is True, json.dumps(o)[:300])
    ctx.record(mode, "JAX", (got or ref or {}).get("version"), start,
               {"memory_stats": got and got.get("memory_stats")})


def row_jax_default(ctx):
    jax_row(ctx, "preallocation, XLA_PYTHON_CLIENT_MEM_FRACTION=0.5", {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})


def row_jax_platform(ctx):
    jax_row(ctx, "XLA_PYTHON_CLIENT_ALLOCATOR=platform",
            {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})


def cupy_row(ctx, mode, opts, expected):
    start = len(check.results)
    (ref,) = ctx.reference([work("cupy", *opts)])
    (got,) = ctx.hooked(ctx.row.name, [work("cupy", *opts)], ctx.start_daemon())
    if ref and got:
        check("%s: product equals the run without the hook (rel 1e-6)" % ctx.row.name,
              same(got["checksum"], ref["checksum"], 1e-6), "with %s, without %s" % (got["checksum"], ref["checksum"]))
    ctx.oom(ctx.row.name, got, expected)
    ctx.record(mode, "CuPy", (got or ref or {}).get("version"), start)


def row_cupy_pool(ctx):
    cupy_row(ctx, "default memory pool", [], "cupy.OutOfMemoryError")


def row_cupy_nopool(ctx):
    cupy_row(ctx, "set_allocator(None)", ["--no-pool"], "cupy_backends.CUDARuntimeError")


def row_transformers_generate(ctx):
    start = len(check.results)
    (ref,) = ctx.reference([work("transformers")])
    (got,) = ctx.hooked(ctx.row.name, [work("transformers")], ctx.start_daemon())
    if ref and got:
        check("%s: generated tokens equal the run without the hook" % ctx.row.name, got["tokens"] == ref["tokens"],
              "with %s, without %s" % (got["tokens"], ref["tokens"]))
    ctx.oom(ctx.row.name, got, "torch.OutOfMemoryError")
    ctx.record("GPT-2 (2 layers, random weights), greedy generate", "transformers", (got or ref or {}).get("version"),
               start)


SANITIZER_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
__global__ void fill(int* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = 2 * (i % 1000);
}
int main(int argc, char** argv) {
  size_t over = argc > 1 ? strtoull(argv[1], nullptr, 10) : 0;
  const int n = 1 << 26;  // 256 MiB of int
  int* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(int) * n);
  if (e != cudaSuccess) { printf("@@ {\"result\":{\"error\":\"%s\"}}\n", cudaGetErrorName(e)); return 1; }
  fill<<<(n + 255) / 256, 256>>>(d, n);
  int* h = static_cast<int*>(malloc(sizeof(int) * n));
  e = cudaMemcpy(h, d, sizeof(int) * n, cudaMemcpyDeviceToHost);
  long long sum = 0, want = 0;
  for (int i = 0; i < n; ++i) { sum += h[i]; want += 2 * (i % 1000); }
  printf("@@ {\"holding\":{\"held\":%zu}}\n", sizeof(int) * n);
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) line[0] = 0;
  const char* oom = "none";
  if (over) {
    void* p = nullptr;
    oom = cudaGetErrorName(cudaMalloc(&p, over));
    cudaGetLastError();
  }
  int* small = nullptr;
  bool after = cudaMalloc(&small, 64 << 20) == cudaSuccess && cudaFree(small) == cudaSuccess;
  cudaFree(d);
  free(h);
  printf("@@ {\"result\":{\"version\":\"cudart %d\",\"copy\":\"%s\",\"sum\":%lld,\"want\":%lld,"
         "\"oom\":{\"error\":\"%s\",\"after\":%s}}}\n",
         CUDART_VERSION, cudaGetErrorName(e), sum, want, oom, after ? "true" : "false");
  return 0;
}
"""


def row_sanitizer_memcheck(ctx):
    start = len(check.results)
    nvcc = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    sanitizer = shutil.which("compute-sanitizer") or (
        os.path.exists("/usr/local/cuda/bin/compute-sanitizer") and "/usr/local/cuda/bin/compute-sanitizer")
    if not nvcc or not sanitizer:
        raise Skip("nvcc or compute-sanitizer not found")
    src = os.path.join(ctx.work, "fill.cu")
    prog = os.path.join(ctx.work, "fill")
    with open(src, "w") as f:
        f.write(SANITIZER_PROGRAM)
    p = subprocess.run([nvcc, "-O2", "-o", prog, src], capture_output=True, text=True, timeout=300)
    if not check("%s: nvcc builds the test program" % ctx.row.name, p.returncode == 0, p.stderr[-500:]):
        return
    env = ctx.start_daemon()
    # compute-sanitizer starts the program with this environment: the hook is preloaded into it
    # (and, unused, into the sanitizer's front end).
    label = ctx.row.name
    (got,) = ctx.hooked(label, [[sanitizer, "--tool", "memcheck", "--error-exitcode", "3", prog]], env,
                        limit_arg=False)
    p = ctx.last[0]
    with open(p.err_path, errors="replace") as f:
        report = "".join(p.out) + f.read()
    summary = [l for l in report.splitlines() if "ERROR SUMMARY" in l]
    check("%s: ERROR SUMMARY: 0 errors, exit 0" % label, p.p.returncode == 0 and summary and
          summary[-1].strip().endswith("ERROR SUMMARY: 0 errors"),
          "exit %s; %s" % (p.p.returncode, " / ".join(l for l in report.splitlines() if l.startswith("=")
                                                     or "vlake:" in l)[-1200:]))
    if got:
        check("%s: the program's result under memcheck" % label,
              got.get("sum") == got.get("want") and got.get("copy") == "cudaSuccess", json.dumps(got))
    # The over-limit allocation without the sanitizer (memcheck reports failed API calls as errors).
    (plain,) = ctx.hooked(label + " (no sanitizer)", [[prog, str(ctx.limit + GiB)]], env, limit_arg=False)
    ctx.oom(label + " (no sanitizer)", plain, "cudaErrorMemoryAllocation")
    ctx.record("compute-sanitizer --tool memcheck", "compute-sanitizer", (got or {}).get("version"), start)


def row_fork_after_init(ctx):
    start = len(check.results)
    (got,) = ctx.hooked(ctx.row.name, [work("fork")], ctx.start_daemon())
    if got:
        check("%s: a child not touching CUDA exits fine" % ctx.row.name, got["plain_child"] == "exit 0",
              got["plain_child"])
        rcs = got.get("cuda_child_results") or {}
        failed = {k: v for k, v in rcs.items() if v != 0}
        check("%s: a child calling the driver gets the driver's error, no hang, no crash" % ctx.row.name,
              got["cuda_child"] == "exit 0" and bool(failed) and "exception" not in rcs,
              "%s; return codes %s" % (got["cuda_child"], json.dumps(rcs)))
        check("%s: the parent keeps allocating" % ctx.row.name,
              got["parent_after_plain_child"] is True and got["parent_after_cuda_child"] is True, json.dumps(got)[:300])
    ctx.oom(ctx.row.name, got, "torch.OutOfMemoryError")
    ctx.record("fork after cuInit", "PyTorch + driver API", (got or {}).get("version"), start,
               {"cuda_child_rcs": got and got.get("cuda_child_results")})


def bypass_refused(ctx, label, rc, amount, what):
    check("%s: refused with CUDA_ERROR_OUT_OF_MEMORY after %.0f MiB, within the limit" % (label, amount / MiB),
          rc == 2 and amount <= ctx.limit, "%s: rc %s after %.0f MiB (limit %.0f MiB)" % (what, rc, amount / MiB,
                                                                                       ctx.limit / MiB))


def row_bypass_rdma(ctx):
    start = len(check.results)
    (got,) = ctx.hooked(ctx.row.name, [work("bypass_rdma")], ctx.start_daemon())
    if got:
        bypass_refused(ctx, ctx.row.name, got["refused_rc"], got["created"], "cuMemCreate(gpuDirectRDMACapable)")
    ctx.record("cuMemCreate, gpuDirectRDMACapable, POSIX fd", "driver API", (got or {}).get("version"), start,
               {"created_MiB": got and got["created"] // MiB, "rc": got and got["refused_rc"],
                "rdma_flag": got and got["rdma_flag"]})


def pool_row(ctx, mode, opts):
    start = len(check.results)
    (got,) = ctx.hooked(ctx.row.name, [work("bypass_pool", *opts)], ctx.start_daemon())
    if got and check("%s: the pool exists" % ctx.row.name, "error" not in got, got.get("error", "")):
        bypass_refused(ctx, ctx.row.name, got["refused_rc"], got["allocated"], "stream-ordered allocation")
        check("%s: refilling the pool's kept memory stays within the limit" % ctx.row.name,
              got["refilled"] <= ctx.limit and got["refused_again_rc"] == 2,
              "refilled %.0f MiB, then rc %d" % (got["refilled"] / MiB, got["refused_again_rc"]))
    got = got or {}
    ctx.record(mode, "driver API", got.get("version"), start,
               {"allocated_MiB": got.get("allocated", 0) // MiB, "kept_MiB": got.get("kept_after_free", 0) // MiB,
                "rc": got.get("refused_rc")})


def row_bypass_pool(ctx):
    pool_row(ctx, "cuMemPoolCreate + cuMemAllocFromPoolAsync", [])


def row_bypass_default_pool(ctx):
    pool_row(ctx, "default pool, cuMemAllocAsync", ["--default-pool"])


def row_bypass_graph(ctx):
    start = len(check.results)
    (got,) = ctx.hooked(ctx.row.name, [work("bypass_graph")], ctx.start_daemon())
    if got:
        check("%s: a 512 MiB graph allocation works" % ctx.row.name, got["small"]["rc"] == 0, json.dumps(got["small"]))
        check("%s: a graph allocating limit + 1 GiB is refused with CUDA_ERROR_OUT_OF_MEMORY" % ctx.row.name,
              got["big"]["rc"] == 2 and got["big"]["stage"] in ("cuGraphInstantiateWithFlags", "cuGraphLaunch"),
              json.dumps(got["big"]))
    ctx.record("cuGraphAddMemAllocNode", "driver API", (got or {}).get("version"), start,
               {"refused_at": got and got["big"]["stage"], "rc": got and got["big"]["rc"]})


class Row:
    def __init__(self, name, fn, needs, gpus=1, limit=4 * GiB):
        self.name, self.fn, self.needs, self.gpus, self.limit = name, fn, needs, gpus, limit
        self.device = ""


ROWS = {r.name: r for r in (
    Row("torch.default", row_torch_default, "torch"),
    Row("torch.expandable", row_torch_expandable, "torch"),
    Row("torch.async", row_torch_async, "torch"),
    Row("torch.graphs", row_torch_graphs, "torch"),
    Row("torch.mp_ipc", row_torch_mp_ipc, "torch"),
    Row("torch.dataloader", row_torch_dataloader, "torch"),
    Row("torch.nccl", row_torch_nccl, "torch", gpus=2),
    Row("jax.default", row_jax_default, "jax"),
    Row("jax.platform", row_jax_platform, "jax"),
    Row("cupy.pool", row_cupy_pool, "cupy"),
    Row("cupy.nopool", row_cupy_nopool, "cupy"),
    Row("transformers.generate", row_transformers_generate, "transformers"),
    Row("sanitizer.memcheck", row_sanitizer_memcheck, None),
    Row("fork.after_init", row_fork_after_init, "torch"),
    Row("bypass.rdma", row_bypass_rdma, None, limit=2 * GiB),
    Row("bypass.pool", row_bypass_pool, None, limit=2 * GiB),
    Row("bypass.default_pool", row_bypass_default_pool, None, limit=2 * GiB),
    Row("bypass.graph", row_bypass_graph, None, limit=2 * GiB),
)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--row")
    ap.add_argument("--list", action="store_true")
    for tool in ("--vlaked", "--hook", "--state-tool", "--vlakectl"):
        ap.add_argument(tool)
    ap.add_argument("--results", help="append one JSON line per mode here")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.list:
        print("\n".join(ROWS))
        return 0
    row = ROWS.get(args.row)
    if row is None:
        print("unknown row %r; rows: %s" % (args.row, " ".join(ROWS)))
        return 2
    if not shutil.which("nvidia-smi"):
        print("SKIP: no NVIDIA GPU here (nvidia-smi not found)")
        return SKIP
    n = gpu_count()
    if n < row.gpus:
        print("SKIP: %s needs %d GPUs, NVML sees %d" % (row.name, row.gpus, n))
        return SKIP
    if row.needs and importlib.util.find_spec(row.needs) is None:
        print("SKIP: %s is not installed" % row.needs)
        return SKIP
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True, timeout=60)
    row.device = smi.stdout.strip()
    # CUDA ordinals in NVML's (PCI) order, for the daemon and the workloads alike.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    work_dir = tempfile.mkdtemp(prefix="vlake-compat-")
    os.chmod(work_dir, 0o755)
    ctx = Ctx(args, row, work_dir)
    try:
        row.fn(ctx)
    except Skip as e:
        print("SKIP: %s: %s" % (row.name, e))
        return SKIP
    finally:
        ctx.stop_daemon()
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    if args.results:
        with open(args.results, "a") as f:
            for rec in ctx.records:
                f.write(json.dumps(rec) + "\n")
    for rec in ctx.records:
        print("RESULT " + json.dumps(rec))
    return check.table(100)


if __name__ == "__main__":
    sys.exit(main())
