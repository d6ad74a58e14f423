#!/usr/bin/env python3
"""GPU acceptance test of dedup measured by NVML, not by vlake's counters (docs/dedup.md,
"Serving recipe and NVML acceptance"): the serving recipe of examples/shared-serving (its model, built by
make_model.py, ~1 GB of fp16 weights; its replicas, serve.py) under libvlake-hook.so.

Phases, each measured as NVML's used memory of GPU 0 minus a baseline taken after one tenant
process has come and gone (vlaked's own CUDA context is then in it); a phase's processes end,
and their memory is back, before the next one starts:
  ctx1 / ctx4   1, then 4 processes with CUDA initialised and no model (serve.py --context-only)
  unshared4     4 replicas under the hook, weights private (serve.py --no-share)
  shared1       1 replica that shares its weights (vlake.share_module)
  shared4       3 more, started while it runs
  fifth tenant  while the 4 sharers run: a process outside vlake takes the GPU's memory until
                only (unshared4 - shared4) + 1 GiB is free, i.e. the GPU is as full as it would
                be with 4 unshared replicas; then a fifth tenant (another uid in another
                namespace when this runs as root) allocates what sharing saved and writes it,
                and an allocation of 1.5 GiB more is refused (the GPU really is that full).
Every measurement waits until what the replicas freed has left the hook's local reserve
(VLAKE_RESERVE_AGE=5s) and vlaked's free pool (--pool-idle-release 5s): memory still in either is
on the GPU and is counted. vlaked runs without its warm stock (--warm-stock 0): the clean handles
it builds ahead for sizes in demand (docs/pool.md) are free pool memory that the idle release
keeps while the demand lasts, and would be counted as if the replicas held it.

Checks (exit 0 only if all pass; 77 = skipped without a GPU, PyTorch or transformers):
  - (shared4 - ctx4) <= 1.10 x (shared1 - ctx1)
  - (unshared4 - ctx4) >= 3.5 x (shared1 - ctx1)
  - every replica shared its weights; all but the first merged every chunk
  - every replica's answers (greedy, 16 tokens) equal a run without the hook
  - the fifth tenant gets the saved bytes with no OOM; 1.5 GiB more is refused
  - with --alloc-conf expandable, PyTorch really used expandable segments for the weights
A table prints NVML's figures beside vlake's counters (vlake_state_json).

  dedup_nvml.py --vlaked PATH --hook PATH --state-tool PATH [--alloc-conf default|expandable]
"""
import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "shared-serving")
sys.path.insert(0, HERE)
sys.path.insert(0, EXAMPLE)
from checks import GiB, MiB, SKIP, Checks, testprocs  # noqa: E402
import node_slice as ns  # noqa: E402

RESERVE_AGE_S = 5
IDLE_S = 5
SAMPLE_MS = 200
SETTLE_S = RESERVE_AGE_S + IDLE_S + SAMPLE_MS / 1000 + 2  # reserve -> pool -> driver, plus margin
HEADROOM = 1 * GiB  # free memory left beside the saved bytes for the fifth tenant's own context
MIN_SAVED = 1 * GiB  # less saved than this (a quarter of 4 replicas' ~3.7 GiB) leaves nothing to test
OTHER_UID = 65534
PROMPTS = ["The quick brown fox", "Shared weights, private activations.", "vlake"]
NEW_TOKENS = 16

# A plain CUDA program (ctypes, no PyTorch): `fill TARGET_FREE` allocates until the driver
# reports at most TARGET_FREE bytes free; `fifth BYTES EXTRA` allocates BYTES and writes them,
# then tries EXTRA more. One JSON line, then it holds its memory until stdin closes.
CUDA_PROGRAM = r"""
import ctypes, json, os, sys
mode, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cuda = ctypes.CDLL("libcuda.so.1")
def out(**kw):
    print(json.dumps(kw), flush=True)
def ck(rc, what):
    if rc != 0:
        out(event="error", what=what, rc=rc)
        sys.exit(3)
u64 = ctypes.c_uint64
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t]
cuda.cuMemsetD8_v2.argtypes = [u64, ctypes.c_ubyte, ctypes.c_size_t]
cuda.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
ck(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
ck(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ck(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ck(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
hooked = hasattr(ctypes.CDLL(None), "vlake_share_chunk_bytes")
def free_bytes():
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    ck(cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t)), "cuMemGetInfo_v2")
    return f.value
keep = []
if mode == "fill":
    held = 0
    for step in (1 << 30, 64 << 20, 2 << 20):
        while free_bytes() > a + step:
            p = u64()
            if cuda.cuMemAlloc_v2(ctypes.byref(p), step) != 0:
                break
            keep.append(p.value)
            held += step
    out(event="filled", held=held, free=free_bytes(), hooked=hooked)
else:
    p = u64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), a)
    if rc == 0:
        rc = cuda.cuMemsetD8_v2(p.value, 0x5A, a) or cuda.cuCtxSynchronize()
    q = u64()
    over = cuda.cuMemAlloc_v2(ctypes.byref(q), b)
    out(event="fifth", rc=rc, over_rc=over, hooked=hooked, uid=os.getuid())
for _ in sys.stdin:
    pass
"""

check = Checks()


class Proc:
    """A child whose stdout JSON lines are read by a thread; stderr goes to a file."""

    def __init__(self, cmd, env, log, user=None, cwd=None, group=None):
        """`user`: run as that uid (and gid); `group`: only with that primary group (uid unchanged)."""
        kw = {"user": user, "group": user, "extra_groups": [], "cwd": cwd} if user is not None else {}
        if group is not None:
            kw.update(group=group, extra_groups=[])
        self.log = log
        self.err = open(log, "w")
        self.p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True, **kw)
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            if line.startswith("{"):
                self.q.put(json.loads(line))
        self.q.put(None)

    def next(self, timeout=600):
        try:
            d = self.q.get(timeout=timeout)
        except queue.Empty:
            d = None
        if d is None:
            self.err.flush()
            with open(self.log) as f:
                tail = "".join(f.readlines()[-25:])
            raise RuntimeError("%s gave no answer (exit %s); stderr tail:\n%s" % (self.p.args[:3], self.p.poll(), tail))
        return d

    def send(self, text):
        self.p.stdin.write(text)
        self.p.stdin.flush()

    def end(self, timeout=120):
        testprocs.end(self.p, timeout)
        self.err.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vlaked", required=True)
    ap.add_argument("--hook", required=True)
    ap.add_argument("--state-tool", required=True)
    ap.add_argument("--alloc-conf", choices=["default", "expandable"], default="default")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    probe = subprocess.run([sys.executable, "-c", "import torch, transformers, numpy; "
                            "print(torch.cuda.is_available())"], capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        print("SKIP: no GPU with PyTorch, transformers and numpy here")
        return SKIP
    import make_model  # the example's model (examples/shared-serving/make_model.py)
    from nvml import Nvml
    nv = Nvml(0)

    work = tempfile.mkdtemp(prefix="vlake-dedup-nvml-")
    os.chmod(work, 0o755)
    model_dir = os.path.join(work, "model")
    t0 = time.monotonic()
    replica_bytes = make_model.build(model_dir)
    print("model: %.1f MiB of weights, built in %.1f s" % (replica_bytes / MiB, time.monotonic() - t0), flush=True)

    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    if args.alloc_conf == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    serve = os.path.join(EXAMPLE, "serve.py")
    counter = [0]

    def start(hooked_env, *serve_args):
        counter[0] += 1
        return Proc([sys.executable, serve, *serve_args, "--max-new-tokens", str(NEW_TOKENS)], hooked_env,
                    os.path.join(work, "proc%d.err" % counter[0]))

    def answers(p):
        p.send("".join(x + "\n" for x in PROMPTS))
        return [p.next(300)["tokens"] for _ in PROMPTS]

    # Reference: one replica without the hook.
    ref = start(env, model_dir, "--no-share")
    ref.next()
    reference = answers(ref)
    ref.end()

    root = os.geteuid() == 0
    config = ("version: 1\ndefault:\n  dedup_domain: replicas\n  enforce: account\n"
              + ("namespaces:\n  - name: other\n    users: [%d]\n    enforce: account\n" % OTHER_UID if root else ""))
    daemon = ns.Daemon(args.vlaked, work, config,
                       ("--pool-idle-release", "%ds" % IDLE_S, "--sample-interval-ms", str(SAMPLE_MS),
                        "--warm-stock", "0"))
    procs = []
    rows = []  # (phase, NVML - baseline, counters)
    completed = False
    try:
        hooked = dict(env, LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock, VLAKE_RESERVE_AGE=f"{RESERVE_AGE_S}s")
        # vlaked creates its own CUDA context with the first grant: one tenant process first, so
        # that the baseline holds it (and nothing of the process once its memory is released).
        # With expandable segments PyTorch allocates through cuMemCreate, which vlaked does not
        # serve from its pool: the warm-up uses the default allocator (cuMemAlloc, a grant) so that
        # vlaked's context exists in every mode, and the test checks that it does.
        warm_env = dict(hooked)
        warm_env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        warm = start(warm_env, "--context-only")
        warm.next()
        warm.end()
        time.sleep(SETTLE_S)
        listed = nv.processes()
        if daemon.proc.pid not in listed:
            raise RuntimeError("vlaked has no CUDA context after the warm-up (NVML lists %s): the baseline "
                               "would miss it" % sorted(listed))
        baseline = nv.memory()["used"]

        def used():
            return nv.memory()["used"] - baseline

        def counters():
            s = ns.state_json(args.state_tool, daemon.state)
            d = [x for x in s["devices"] if x["ordinal"] == 0][0]
            return {k: d[k] for k in ("pool_bytes", "free_bytes", "granted_bytes", "dedup_logical_bytes",
                                      "dedup_physical_bytes")}

        def measure(phase, settle=True):
            if settle:
                time.sleep(SETTLE_S)
            v = used()
            rows.append((phase, v, counters()))
            print("%-40s NVML used - baseline %9.1f MiB" % (phase, v / MiB), flush=True)
            return v

        def end_all():
            for p in procs:
                p.end()
            del procs[:]
            deadline = time.monotonic() + SETTLE_S + 20
            while used() > 64 * MiB and time.monotonic() < deadline:
                time.sleep(0.5)
            if used() > 64 * MiB:
                print("WARN memory not back after the phase: %.1f MiB over the baseline; NVML's processes "
                      "(pid: MiB): %s" % (used() / MiB, {p: round(b / MiB, 1) for p, b in nv.processes().items()}),
                      flush=True)

        # Processes with CUDA initialised and no model.
        procs.append(start(hooked, "--context-only"))
        procs[-1].next()
        ctx1 = measure("1 process, CUDA initialised, no model", settle=False)
        for _ in range(3):
            procs.append(start(hooked, "--context-only"))
        for p in procs[1:]:
            p.next()
        ctx4 = measure("4 processes, CUDA initialised, no model", settle=False)
        end_all()

        # Four replicas, weights private.
        procs.extend(start(hooked, model_dir, "--no-share") for _ in range(4))
        for p in procs:
            p.next()
        immediate = used()
        unshared4 = measure("4 replicas, not shared")
        un_answers = [answers(p) for p in procs]
        print("INFO 4 unshared replicas right after loading: %.1f MiB over the baseline" % (immediate / MiB))
        end_all()

        # One replica shares its weights; three more join it.
        procs.append(start(hooked, model_dir))
        readies = [procs[0].next()]
        immediate = used()
        shared1 = measure("1 replica, shared")
        print("INFO 1 shared replica right after share_module + empty_cache: %.1f MiB over the baseline"
              % (immediate / MiB))
        procs.extend(start(hooked, model_dir) for _ in range(3))
        readies += [p.next() for p in procs[1:]]
        shared4 = measure("4 replicas, shared")
        sh_answers = [answers(p) for p in procs]
        after = used()
        print("INFO 4 shared replicas after answering: %.1f MiB over the baseline (activations, cuBLAS "
              "workspaces and PyTorch's cache of each replica)" % (after / MiB))

        one = max(shared1 - ctx1, 1)
        check("4 shared replicas: (shared4 - ctx4) <= 1.10 x (shared1 - ctx1)",
              shared4 - ctx4 <= 1.10 * one,
              "%.1f MiB vs one replica %.1f MiB: %.3fx (replica's weights %.1f MiB; contexts 1: %.1f, 4: %.1f MiB)"
              % ((shared4 - ctx4) / MiB, one / MiB, (shared4 - ctx4) / one, replica_bytes / MiB, ctx1 / MiB,
                 ctx4 / MiB))
        check("4 unshared replicas: (unshared4 - ctx4) >= 3.5 x (shared1 - ctx1)",
              unshared4 - ctx4 >= 3.5 * one,
              "%.1f MiB: %.2fx" % ((unshared4 - ctx4) / MiB, (unshared4 - ctx4) / one))
        stats = [r.get("stats") or {} for r in readies]
        merged = [s.get("merged_bytes", -1) for s in stats]
        check("every replica shared its weights",
              all(r.get("shared") and s.get("shared_bytes", 0) >= replica_bytes for r, s in zip(readies, stats)),
              "shared MiB %s, weights %.1f MiB" % ([round(s.get("shared_bytes", 0) / MiB, 1) for s in stats],
                                                   replica_bytes / MiB))
        check("the first replica merged nothing and the others every chunk",
              merged[0] == 0 and all(m == stats[0].get("shared_bytes") for m in merged[1:]),
              "merged MiB %s" % [round(m / MiB, 1) for m in merged])
        check("answers of the 4 shared replicas equal the run without the hook",
              all(a == reference for a in sh_answers))
        check("answers of the 4 unshared replicas equal the run without the hook",
              all(a == reference for a in un_answers))
        if args.alloc_conf == "expandable":
            flags = [r.get("expandable") for r in readies]
            if any(f is None for f in flags):
                print("INFO PyTorch's memory snapshot does not say whether segments are expandable")
            else:
                check("PyTorch used expandable segments for the weights", all(flags), str(flags))

        # The fifth tenant gets what sharing saved, on a GPU as full as with 4 unshared replicas.
        saved = unshared4 - shared4
        if saved < MIN_SAVED:
            raise RuntimeError("sharing saved only %.1f MiB: no fifth tenant to test" % (saved / MiB))
        target_free = saved + HEADROOM
        fill = Proc([sys.executable, "-c", CUDA_PROGRAM, "fill", str(target_free), "0"], env,
                    os.path.join(work, "fill.err"))
        procs.append(fill)
        filled = fill.next()
        if filled.get("event") != "filled" or filled.get("hooked"):
            raise RuntimeError("the filler failed: %s" % filled)
        hook_path, python, user = args.hook, sys.executable, None
        if root:  # another uid: another tenant, in namespace `other`
            hook_path = os.path.join(work, "libvlake-hook.so")
            shutil.copy(args.hook, hook_path)
            os.chmod(hook_path, 0o755)
            python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
            user = OTHER_UID
        fifth = Proc([python, "-c", CUDA_PROGRAM, "fifth", str(saved), str(HEADROOM + 512 * MiB)],
                     dict(env, LD_PRELOAD=hook_path, VLAKE_SOCKET=daemon.sock), os.path.join(work, "fifth.err"),
                     user=user, cwd=work)
        procs.append(fifth)
        r5 = fifth.next()
        measure("4 shared + filler + fifth tenant", settle=False)
        if not r5.get("hooked"):
            raise RuntimeError("the fifth tenant runs without the hook: %s (see %s)" % (r5, fifth.log))
        who = ("uid %d, namespace other" % r5.get("uid")) if root else "the replicas' uid (not root: same tenant)"
        check("a fifth tenant allocates what sharing saved with no OOM",
              r5.get("event") == "fifth" and r5.get("rc") == 0,
              "%.1f MiB (%s); the filler outside vlake holds %.1f MiB, leaving %.1f MiB free; CUresult %s"
              % (saved / MiB, who, filled["held"] / MiB, filled["free"] / MiB, r5.get("rc")))
        check("the GPU was that full: %.1f GiB more is refused" % ((HEADROOM + 512 * MiB) / GiB),
              r5.get("over_rc") == 2, "CUresult %s (2 = out of memory)" % r5.get("over_rc"))
        completed = True
    finally:
        for p in procs:
            p.end(30)
        daemon.stop()
        print("\n%-40s %12s %10s %10s %10s %12s %12s" % ("phase (MiB)", "NVML-base", "pool", "free pool",
                                                       "granted", "dedup logic", "dedup phys"))
        for phase, v, c in rows:
            print("%-40s %12.1f %10.1f %10.1f %10.1f %12.1f %12.1f"
                  % (phase, v / MiB, c["pool_bytes"] / MiB, c["free_bytes"] / MiB, c["granted_bytes"] / MiB,
                     c["dedup_logical_bytes"] / MiB, c["dedup_physical_bytes"] / MiB))
        if check.any_failed() or not completed:
            with open(daemon.log.name) as f:
                print("---- vlaked log (tail) ----\n" + "".join(f.readlines()[-30:]))
        if args.keep:
            print("work directory kept: " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return check.table(80)


if __name__ == "__main__":
    sys.exit(main())
