#!/usr/bin/env python3
"""Reclaim (docs/hook.md, "Reclaim") on the simulator, through python/vlake (label sim):
  1. tenant L (namespace low, priority 0) holds 640 MiB of a 1 GiB GPU as its "cache" and
     registers vlake.enable_reclaim() with a callback that frees it; tenant H (namespace high,
     priority 10) asks for 512 MiB: vlaked parks the grant, asks L, L's callback frees, and H's
     allocation succeeds (within 2 s); L ran its callback once and goes on allocating afterwards;
     the simulated device's NVML figure goes from L's 640 MiB to H's 512 MiB;
  2. L (low) now asks for 768 MiB while H (high) holds 512 MiB and has a callback of its own:
     H is never asked (a tenant never takes memory from a higher-priority one), L is refused
     (CUDA_ERROR_OUT_OF_MEMORY) and H's callback never ran;
  3. disable_reclaim() unregisters: a process without callbacks is not asked;
  4. a process with VLAKE_WAIT=5s whose allocation no memory can serve waits, and gets it when
     another frees a second later; without a wait it is refused at once.
Tenants run as two users (uids 64201, 64202), so the test runs as root; it fails otherwise.

  python_reclaim.py --vlaked PATH --hook PATH --driver PATH --nvml PATH --state-tool PATH
"""
import argparse
import json
import os
import subprocess
import sys
import time

from sim_vlaked import TENANT_PROLOGUE, SimVlaked, testprocs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
UID_LOW, UID_HIGH = 64201, 64202

# Commands on stdin, one JSON line out per command:
#   hold N        allocate N MiB (kept)          -> {"rc"}
#   reclaim       enable_reclaim: the callback frees every held allocation -> {"ok"}
#   alloc N       allocate N MiB, timed          -> {"rc", "ms"}
#   stats         -> {"count" (vlake_reclaim_count), "calls" (callback runs), "held"}
#   off           disable_reclaim                -> {"ok"}
TENANT = "\nimport ctypes, json, sys, time, threading\n" + TENANT_PROLOGUE + r"""cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
held, lock, calls, handle = [], threading.Lock(), [0], None
def alloc(n):
    p = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), n << 20)
    return rc, p.value
def reclaim(device, nbytes):
    # the hook's thread: no context is current here
    assert cuda.cuCtxSetCurrent(ctx) == 0
    with lock:
        calls[0] += 1
        freed = 0
        while held:
            p, n = held.pop()
            assert cuda.cuMemFree_v2(p) == 0
            freed += n << 20
    return freed
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "hold":
        rc, p = alloc(int(cmd[1]))
        if rc == 0:
            with lock:
                held.append((p, int(cmd[1])))
        out = {"rc": rc}
    elif cmd[0] == "reclaim":
        handle = vlake.enable_reclaim(reclaim)
        out = {"ok": True}
    elif cmd[0] == "alloc":
        t = time.monotonic()
        rc, p = alloc(int(cmd[1]))
        out = {"rc": rc, "ms": (time.monotonic() - t) * 1e3}
        if rc == 0:
            with lock:
                held.append((p, int(cmd[1])))
    elif cmd[0] == "stats":
        time.sleep(0.3)
        with lock:
            out = {"count": vlake.reclaim_count(), "calls": calls[0], "held": sum(n for _, n in held)}
    elif cmd[0] == "off":
        vlake.disable_reclaim(handle)
        out = {"ok": True}
    elif cmd[0] == "freeall":
        with lock:
            rcs = [cuda.cuMemFree_v2(p) for p, _ in held]
            held.clear()
        out = {"rcs": rcs}
    print(json.dumps(out), flush=True)
"""

results = []
# The tenants run as other users: an interpreter they may execute (a per-user installation under
# root's home is not).
TENANT_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""), flush=True)


class Tenant:
    def __init__(self, env, uid):
        def drop():  # keeps gid 0: the simulator's node file is group-shared (umask 0002)
            os.setgroups([])
            os.setuid(uid)
        self.p = subprocess.Popen([TENANT_PYTHON, "-B", "-c", TENANT, os.path.join(ROOT, "python")], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=drop)

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def ask(self, line):
        self.send(line)
        return self.answer(line)

    def answer(self, line):
        out = self.p.stdout.readline()
        if not out:
            raise RuntimeError("tenant exited (%s) on %r" % (self.p.wait(), line))
        return json.loads(out)

    def close(self):
        testprocs.end(self.p, 10)


def device_used(tool, st):
    """What the simulated device's NVML says is used on it (vlaked's latest sample)."""
    out = subprocess.run([tool, "--state", st, "--json"], capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)["devices"][0]["nvml_used_bytes"]


def wait_used(tool, st, ok, timeout=5.0):
    deadline = time.time() + timeout
    while True:
        used = device_used(tool, st)
        if ok(used) or time.time() > deadline:
            return used
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser()
    for a in ("--vlaked", "--hook", "--driver", "--nvml", "--state-tool"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("FAIL python_reclaim: runs tenants as two users, so it needs root")
        return 1

    config = ("version: 1\ndefault:\n  limit: 1GiB\nnamespaces:\n"
              "  - {name: low, priority: 0, users: [%d]}\n  - {name: high, priority: 10, users: [%d]}\n"
              % (UID_LOW, UID_HIGH))
    old_umask = os.umask(0o002)  # the simulator's node file: tenants of other uids open it
    try:
        with SimVlaked(args, "reclaim", config, ("--pressure-wait-ms", "3000", "--pool-idle-release", "200ms"),
                       lambda: not all(results)) as vd:
            return run_tenants(args, vd)
    finally:
        os.umask(old_umask)


def run_tenants(args, vd):
    st = vd.state
    tenv = vd.tenant_env(args.hook, VLAKE_RESERVE="0", VLAKE_LOG="info")
    tenants = []
    try:
        low, high = Tenant(tenv, UID_LOW), Tenant(tenv, UID_HIGH)
        tenants = [low, high]

        r = low.ask("hold 640")
        used0 = wait_used(args.state_tool, st, lambda u: u >= 640 * MiB)
        check("L holds 640 MiB of the 1 GiB GPU, and the device says so", r["rc"] == 0 and used0 == 640 * MiB,
              "%s, device used %d MiB" % (r, used0 // MiB))
        low.ask("reclaim")
        time.sleep(0.5)  # the report that says L can reclaim
        r = high.ask("alloc 512")
        check("H's 512 MiB succeeds by reclaiming L's cache, within 2 s", r["rc"] == 0 and r["ms"] < 2000, str(r))
        s = low.ask("stats")
        check("L ran its callback once and freed everything", s["count"] == 1 and s["calls"] == 1 and s["held"] == 0,
              str(s))
        # NVML sampling (1 s) and the idle release (200 ms) of what L freed beyond H's grant.
        used = wait_used(args.state_tool, st, lambda u: u == 512 * MiB)
        check("the device's own figure (NVML) falls from L's 640 MiB to H's 512 MiB", used == 512 * MiB,
              "device used %d MiB" % (used // MiB))
        r = low.ask("alloc 128")
        check("L goes on allocating afterwards", r["rc"] == 0, str(r))

        high.ask("reclaim")
        time.sleep(0.5)
        r = low.ask("alloc 640")
        check("L (low) is refused rather than taking from H (high)", r["rc"] == 2, str(r))
        s = high.ask("stats")
        check("H's callback never ran", s["count"] == 0 and s["calls"] == 0 and s["held"] == 512, str(s))

        high.ask("off")
        low.ask("off")
        time.sleep(0.5)
        r = high.ask("alloc 512")
        check("without callbacks, nobody is asked: H is refused", r["rc"] == 2, str(r))
        s = low.ask("stats")
        check("L was not asked after disable_reclaim()", s["count"] == 1 and s["held"] == 128, str(s))

        # Waiting for memory (docs/quota.md): W (VLAKE_WAIT=5s) asks for 448 MiB while only 384 MiB
        # are free and nobody can be asked; L frees its 128 MiB a second later; W goes on.
        wt = Tenant(dict(tenv, VLAKE_WAIT="5s"), UID_HIGH)
        tenants.append(wt)
        # W is up (interpreter, driver, context) before the clock starts: the wait measured is
        # the one for memory, not the tenant's start-up (a slow interpreter start shortened it).
        wt.ask("stats")
        wt.send("alloc 448")
        time.sleep(1.0)
        r = low.ask("freeall")
        check("L frees its 128 MiB", r["rcs"] == [0], str(r))
        r = wt.answer("alloc 448")
        check("W waited for the memory and got it (VLAKE_WAIT=5s)", r["rc"] == 0 and 900 <= r["ms"] < 5000, str(r))
        r = high.ask("alloc 512")
        check("without a wait, H is refused at once", r["rc"] == 2 and r["ms"] < 500, str(r))
    finally:
        for t in tenants:
            t.close()
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
