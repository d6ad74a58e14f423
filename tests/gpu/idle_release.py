#!/usr/bin/env python3
"""GPU acceptance test of the free pool's idle release (docs/pool.md, "Idle release"), measured
by NVML, not by vlake's counters:
  1. a PyTorch tenant under the hook (VLAKE_RESERVE=0: frees reach the daemon at once) creates
     its context (and vlaked's) with a 64 MiB tensor, then allocates 20 GiB and frees it (empty_cache); it allocates 20 GiB again right away: the warm path
     serves it from the free pool (vlaked creates no handle: handles_created unchanged);
  2. it frees again and stays idle: NVML's used memory falls back to where it was before the
     20 GiB (within 256 MiB; both contexts were there already) within the idle period
     (--pool-idle-release 5s) plus one sample interval plus 2 s;
  3. vlake_pool_idle_released_bytes_total (metrics) counts at least the 20 GiB.
Exit 0 if every check passed, 1 otherwise, 77 without a GPU or PyTorch.

  idle_release.py --vlaked PATH --hook PATH --state-tool PATH
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checks import GiB, MiB, Checks, testprocs  # noqa: E402
import node_slice as ns  # noqa: E402

IDLE_S = 5
SAMPLE_MS = 200

TENANT = r"""
import sys, time, torch
def step(word):
    print(word, flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)
y = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # both contexts exist from here on
torch.cuda.synchronize()
del y
torch.cuda.empty_cache()
step("ready")
x = [torch.empty(2 << 30, dtype=torch.uint8, device="cuda") for _ in range(10)]
torch.cuda.synchronize()
step("allocated")
del x
torch.cuda.empty_cache()
step("freed")
t = time.monotonic()
x = [torch.empty(2 << 30, dtype=torch.uint8, device="cuda") for _ in range(10)]
torch.cuda.synchronize()
print("warm %.3f" % (time.monotonic() - t), flush=True)
step("reallocated")
del x
torch.cuda.empty_cache()
step("idle")
"""

check = Checks()


def metric(address, name):
    body = urllib.request.urlopen("http://%s/metrics" % address, timeout=10).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    args = testprocs.tool_args("--vlaked", "--hook", "--state-tool")
    if not ns.gpu_present():
        print("skipped: no GPU or no PyTorch")
        return 77
    from nvml import Nvml
    nv = Nvml(0)
    work = tempfile.mkdtemp(prefix="vlake-idle-")
    daemon = None
    tenant = None
    try:
        daemon = ns.Daemon(args.vlaked, work, "version: 1\ndefault:\n  limit: 40GiB\n",
                           ("--pool-idle-release", "%ds" % IDLE_S, "--sample-interval-ms", str(SAMPLE_MS)))
        env = dict(os.environ, LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock, VLAKE_RESERVE="0")
        tenant = subprocess.Popen([sys.executable, "-c", TENANT], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

        def expect(word):
            line = tenant.stdout.readline().strip()
            while line.startswith("warm "):
                expect.warm = float(line.split()[1])
                line = tenant.stdout.readline().strip()
            if line != word:
                raise RuntimeError("tenant said %r, expected %r" % (line, word))
        expect.warm = None

        def go():
            tenant.stdin.write("go\n")
            tenant.stdin.flush()

        expect("ready")
        before = nv.memory()["used"]  # the tenant's and vlaked's contexts, and at most 64 MiB of free pool
        go()
        expect("allocated")
        held = nv.memory()["used"]
        check("the tenant's 20 GiB are on the GPU", held - before >= 20 * GiB,
              "NVML used %.1f MiB before, %.1f MiB holding" % (before / MiB, held / MiB))
        go()
        expect("freed")
        created = ns.state_json(args.state_tool, daemon.state)["counters"]["handles_created"]
        go()
        expect("reallocated")
        again = ns.state_json(args.state_tool, daemon.state)["counters"]
        check("allocating again right away takes the warm path (no handle created)",
              again["handles_created"] == created,
              "handles_created %d -> %d, reuses %d, 20 GiB in %.3f s"
              % (created, again["handles_created"], again["reuses"], expect.warm or -1))
        go()
        expect("idle")
        t0 = time.monotonic()
        deadline = t0 + IDLE_S + SAMPLE_MS / 1000 + 2
        used = nv.memory()["used"]
        while time.monotonic() < deadline + 10 and used - before > 256 * MiB:
            time.sleep(0.1)
            used = nv.memory()["used"]
        took = time.monotonic() - t0
        check("NVML shows the memory back within the idle period + one sample + 2 s",
              used - before <= 256 * MiB and took <= IDLE_S + SAMPLE_MS / 1000 + 2,
              "NVML used %.1f MiB before, %.1f MiB after %.2f s idle (tenant context included; period %d s)"
              % (before / MiB, used / MiB, took, IDLE_S))
        released = metric(daemon.metrics, "vlake_pool_idle_released_bytes_total")
        check("vlake_pool_idle_released_bytes_total counts the 20 GiB", released >= 20 * GiB,
              "%.1f MiB" % (released / MiB))
        go()
        tenant.wait(timeout=60)
    finally:
        if tenant is not None and tenant.poll() is None:
            tenant.kill()
        if daemon is not None:
            daemon.stop()
            if check.any_failed():
                with open(daemon.log.name) as f:
                    print("---- vlaked log (tail) ----\n" + "".join(f.readlines()[-30:]))
        shutil.rmtree(work, ignore_errors=True)
    return check.table(80)


if __name__ == "__main__":
    sys.exit(main())
