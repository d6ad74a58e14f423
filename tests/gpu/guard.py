#!/usr/bin/env python3
"""GPU acceptance test of out-of-bounds guards: a real vlaked on the real driver, PyTorch tenants
under libvlake-hook.so, a raw CUDA kernel writing one element past a tensor.

Checks (table at the end; exit 0 only if all passed, 77 = skipped):
  - fault mode: the overrun gives the tenant CUDA_ERROR_ILLEGAL_ADDRESS, reported as a kernel
    fault of a guarded process (Prometheus vlake_kernel_faults_total{guarded="true"}, vlakectl
    events), not as a guard violation (the driver does not say what was accessed);
  - canary mode: no crash; a `canary` alarm naming the allocation once it is freed;
  - a write inside the tensor raises nothing in either mode;
  - a second tenant training at the same time as the fault is unaffected (same losses);
  - the cost of each mode on alloc/free latency (p50/p99, PyTorch with caching off).

  guard.py --vlaked PATH --hook PATH --vlakectl PATH
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import node_slice as ns  # noqa: E402  (Daemon, run_json, check: the shared check list)
from checks import testprocs  # noqa: E402

CANARY_UID, FAULT_UID = 1001, 1002
# 4 MiB + 4 KiB of float32: a multiple of 256 B (so fault mode ends it at a chunk's end) that
# leaves slack in its last 2 MiB chunk (so canary mode has a pattern after it).
ELEMENTS = (1 << 20) + 1024


# The labels of a kernel fault in a guard-fault-mode tenant that maps no shared chunks.
GUARDED = 'guarded="true",maps_shared="false"'


def metric(addr, name, label):
    text = urllib.request.urlopen("http://%s/metrics" % addr, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def events(vlakectl, state):
    p = subprocess.run([vlakectl, "--state", state, "events", "--json"], capture_output=True, text=True, timeout=30)
    return json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr}


def user_env(base, uid, work):
    home = os.path.join(work, "home-%d" % uid)
    os.makedirs(home, exist_ok=True)
    os.chown(home, uid, uid)
    return dict(base, HOME=home, USER="tenant%d" % uid, LOGNAME="tenant%d" % uid)


def main():
    # --host-tier SIZE: the same tenants in overcommit namespaces with vlaked's host tier on, where
    # they keep the pool and its guards (docs/swap.md, "Host tier").
    args = testprocs.tool_args("--vlaked", "--hook", "--vlakectl", optional=("--host-tier",))
    if not shutil.which("nvidia-smi") or not ns.gpu_present():
        print("SKIP: no GPU with PyTorch here")
        return ns.SKIP
    try:
        import cupy  # noqa: F401
    except ImportError:
        print("SKIP: CuPy (for the raw kernel) is not installed")
        return ns.SKIP

    work = tempfile.mkdtemp(prefix="vlake-guard-")
    os.chmod(work, 0o755)
    config = ("version: 1\ndefault:\n  limit: 24GiB\nusers:\n"
              "  - uid: %d\n    limit: 8GiB\n    guard: canary\n"
              "  - uid: %d\n    limit: 8GiB\n    guard: fault\n" % (CANARY_UID, FAULT_UID))
    extra = ()
    if args.host_tier:
        config = ("version: 1\ndefault:\n  limit: 24GiB\nnamespaces:\n"
                  "  - {name: nb-canary, overcommit: true, limit: 8GiB, guard: canary, users: [%d]}\n"
                  "  - {name: nb-fault, overcommit: true, limit: 8GiB, guard: fault, users: [%d]}\n"
                  % (CANARY_UID, FAULT_UID))
        extra = ("--host-tier", args.host_tier)
    base = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")
    rc, ref, err = ns.run_json([sys.executable, os.path.join(HERE, "train.py"), "--steps", "40"], base)
    ns.check("reference training without the hook", rc == 0 and ref, err[-300:] if rc else "")
    daemon = ns.Daemon(args.vlaked, work, config, extra)
    hooked = dict(base, LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock)
    nocache = dict(hooked, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    poke = os.path.join(HERE, "poke.py")
    try:
        # Writes inside the tensor: no alarm in either mode.
        for uid in (CANARY_UID, FAULT_UID):
            rc, got, err = ns.run_json([sys.executable, poke, str(ELEMENTS), "--inside"],
                                       user_env(nocache, uid, work), user=uid)
            ns.check("write inside the tensor, uid %d: no error" % uid, rc == 0 and got and got["error"] is None,
                     json.dumps(got) if got else err[-300:])
        time.sleep(1)
        ns.check("no alarm from writes inside",
                 (metric(daemon.metrics, "vlake_kernel_faults_total", GUARDED) or 0) == 0 and
                 (metric(daemon.metrics, "vlake_guard_violations_total", 'kind="canary"') or 0) == 0)

        # Fault mode, while another tenant trains.
        trainer = subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"), "--steps", "40"], env=hooked,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        rc, got, err = ns.run_json([sys.executable, poke, str(ELEMENTS)], user_env(nocache, FAULT_UID, work),
                                   user=FAULT_UID)
        ns.check("fault mode: the overrun gives the tenant an illegal-address error",
                 got is not None and got["error"] is not None and "illegal memory access" in got["error"],
                 (json.dumps(got) if got else "") + " " + err[-300:])
        vl = [l for l in err.splitlines() if l.startswith("vlake:")]
        ns.check("fault mode: the hook says it reported the fault", any("fault" in l for l in vl), " | ".join(vl)[:400])
        out, terr = trainer.communicate(timeout=600)
        same = trainer.returncode == 0 and json.loads(out.splitlines()[-1])["losses"] == ref["losses"]
        ns.check("a second tenant training during the fault is unaffected (same losses)", same,
                 terr[-300:] if not same else "")
        time.sleep(1)
        faults = metric(daemon.metrics, "vlake_kernel_faults_total", GUARDED)
        ns.check("fault visible through the exporter as a guarded kernel fault", faults == 1,
                 "vlake_kernel_faults_total{%s} = %s" % (GUARDED, faults))
        ns.check("a kernel fault is no guard violation",
                 (metric(daemon.metrics, "vlake_guard_violations_total", 'kind="canary"') or 0) == 0 and
                 (metric(daemon.metrics, "vlake_guard_violations_total", 'kind="readonly_write"') or 0) == 0)
        # The same overrun found by torch.cuda.synchronize() (cudaDeviceSynchronize).
        rc, got, err = ns.run_json([sys.executable, poke, str(ELEMENTS), "--device-sync"],
                                   user_env(nocache, FAULT_UID, work), user=FAULT_UID)
        vl = [l for l in err.splitlines() if l.startswith("vlake:")]
        ns.check("fault mode, device synchronize: reported too", any("cuCtxSynchronize" in l for l in vl),
                 " | ".join(vl)[:400] or err[-300:])
        time.sleep(1)
        faults = metric(daemon.metrics, "vlake_kernel_faults_total", GUARDED)
        ns.check("two kernel faults counted", faults == 2, "vlake_kernel_faults_total{%s} = %s" % (GUARDED, faults))

        # Canary mode.
        rc, got, err = ns.run_json([sys.executable, poke, str(ELEMENTS)], user_env(nocache, CANARY_UID, work),
                                   user=CANARY_UID)
        ns.check("canary mode: the overrun does not crash the tenant", rc == 0 and got and got["error"] is None,
                 json.dumps(got) if got else err[-300:])
        canaries = None
        for _ in range(50):
            canaries = metric(daemon.metrics, "vlake_guard_violations_total", 'kind="canary"')
            if canaries:
                break
            time.sleep(0.2)
        ns.check("canary alarm visible through the exporter", canaries == 1, "vlake_guard_violations_total{kind=canary} = %s" % canaries)
        ev = events(args.vlakectl, daemon.state)
        print("vlakectl events --json:", json.dumps(ev)[:1500])

        # Cost of each mode on alloc/free latency (1 MiB + 100 B: slack exists for the canary).
        lat = {}
        for name, uid in (("off", None), ("canary", CANARY_UID), ("fault", FAULT_UID)):
            env = user_env(nocache, uid, work) if uid else nocache
            rc, got, err = ns.run_json([sys.executable, os.path.join(HERE, "alloc_latency.py"), str((1 << 20) + 100)],
                                       env, user=uid)
            lat[name] = got
        ns.check("alloc/free latency measured in every mode", all(lat.values()), json.dumps(lat))
        print("alloc+free latency (1 MiB + 100 B, PyTorch caching off): " +
              "; ".join("%s p50 %.1f us p99 %.1f us" % (k, v["p50_us"], v["p99_us"]) for k, v in lat.items() if v))
    finally:
        daemon.stop()
        if ns.check.any_failed():
            with open(daemon.log.name) as f:
                print("---- vlaked log (tail) ----\n" + "".join(f.readlines()[-30:]))
        shutil.rmtree(work, ignore_errors=True)
    return ns.check.table(75)


if __name__ == "__main__":
    sys.exit(main())
