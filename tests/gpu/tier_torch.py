#!/usr/bin/env python3
"""The host tier with PyTorch tenants (docs/swap.md, "Host tier"), checked with NVML.

Tenants under vlaked (--host-tier, made ahead), told apart by their primary group:
  A and B in namespace `nb` (`overcommit: true`, pool memory), C in namespace `work` (a busy
  tenant that fills the GPU so that A and B cannot both fit, as on an 80 GB card; none on one).
  1. A fills --a-gib GiB with a pattern (checksum noted) and goes idle for 5 s.
  2. B asks PyTorch for as much: it cannot fit next to A, so vlaked moves A's allocation to the
     host tier and B is served; B's wait is printed (done when: within 2.5 s).
  3. While B holds its memory, A runs a loop of sums over its data (kernels reading host memory
     over PCIe): the checksums are right, and A's slowdown against the same sums on the GPU is
     printed. vlaked's figure of A's bytes on the host (its published grants) and vlakectl's are
     compared with A's allocation; NVML shows the GPU without A's memory.
  4. B frees: A's memory is back on the GPU (vlaked's figure 0; NVML's used memory holds it
     again), the time printed (done when: within 2 s); A's checksum is intact.
Demote and promote seconds per GiB come from vlaked's log. Needs root (tenants with other
primary groups); exit 77 (skipped) without a GPU, PyTorch or host-located VMM memory.

  tier_torch.py --vlaked PATH --hook PATH --state-tool PATH --vlakectl PATH [--a-gib 45]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checks import GiB, MiB, Checks, torch_gpu_as_root  # noqa: E402
import node_slice as ns  # noqa: E402
from dedup_nvml import Proc  # noqa: E402

GID_A, GID_B, GID_C = 64411, 64412, 64413

PROGRAM = r"""
import json, os, sys, time
import torch
def out(**kw):
    print(json.dumps(kw), flush=True)
torch.cuda.init()
out(event="ready", gid=os.getgid(), pid=os.getpid())
x = None
def checksum():
    # In pieces: a sum with dtype=int64 makes an int64 copy of its input first.
    return sum(int(c.sum(dtype=torch.int64).item()) for c in x.split(1 << 24))
def timed_sums(n):
    sums, ms = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.monotonic()
        sums.append(checksum())
        ms.append((time.monotonic() - t) * 1e3)
    return sums, ms
for line in sys.stdin:
    cmd = line.split()
    t = time.monotonic()
    if cmd[0] == "fill":
        n = int(cmd[1]) // 4
        x = torch.arange(n, dtype=torch.int32, device="cuda")
        x.mul_(7).add_(3)
        s = checksum()
        torch.cuda.synchronize()
        out(event="filled", sum=s, bytes=n * 4, ptr=x.data_ptr())
    elif cmd[0] == "sums":
        sums, ms = timed_sums(int(cmd[1]))
        torch.cuda.empty_cache()
        out(event="sums", sums=sums, ms=ms, ptr=x.data_ptr())
    elif cmd[0] == "alloc":
        try:
            x = torch.empty(int(cmd[1]), dtype=torch.uint8, device="cuda")
            x.fill_(1)
            torch.cuda.synchronize()
            out(event="alloc", ok=True, ms=(time.monotonic() - t) * 1e3)
        except torch.OutOfMemoryError as e:
            out(event="alloc", ok=False, ms=(time.monotonic() - t) * 1e3, error=str(e)[:200])
    elif cmd[0] == "free":
        x = None
        torch.cuda.empty_cache()
        out(event="freed")
"""


def session_of(st, pid):
    for s in st["sessions"]:
        if s["pid"] == pid:
            return s
    return None


def host_bytes(args, daemon, pid):
    s = session_of(ns.state_json(args.state_tool, daemon.state), pid)
    return None if s is None else s["host_bytes"]


def vlakectl_host(args, daemon, pid):
    out = subprocess.run([args.vlakectl, "processes", "--state", daemon.state, "--json"], capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:
        return None
    for p in json.loads(out.stdout)["processes"]:
        if p["pid"] == pid:
            return p.get("host_bytes")
    return None


def main():
    ap = argparse.ArgumentParser()
    for a in ("--vlaked", "--hook", "--state-tool", "--vlakectl"):
        ap.add_argument(a, required=True)
    ap.add_argument("--a-gib", type=float, default=45.0)
    ap.add_argument("--loops", type=int, default=3)
    args = ap.parse_args()
    rc = torch_gpu_as_root("tier_torch")
    if rc is not None:
        return rc
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit(0)
    attr = ctypes.c_int(0)
    # CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 141 (cuda.h)
    if cuda.cuDeviceGetAttribute(ctypes.byref(attr), 141, 0) != 0 or attr.value != 1:
        print("SKIP: this driver cannot make host-located VMM memory")
        return 77
    from nvml import Nvml
    nv = Nvml(0)
    total = nv.memory()["total"]
    check = Checks()
    a_bytes = int(args.a_gib * GiB) // (2 * MiB) * (2 * MiB)
    # C makes the GPU as tight as an 80 GB card would be for two tenants of a_bytes each.
    c_bytes = max(0, (total - 2 * a_bytes + 4 * GiB) // (2 * MiB) * (2 * MiB))
    bound = a_bytes + 4 * GiB
    work = tempfile.mkdtemp(prefix="vlake-tier-torch-")
    os.chmod(work, 0o755)
    config = ("version: 1\ndefault:\n  limit: 100%%\nnamespaces:\n"
              "  - {name: nb, overcommit: true, groups: [%d, %d]}\n  - {name: work, groups: [%d]}\n"
              % (GID_A, GID_B, GID_C))
    daemon = ns.Daemon(args.vlaked, work, config, ("--warm-stock", "0", "--swap-idle", "3s", "--host-tier",
                                                   "%dMiB" % (bound // MiB), "--host-tier-piece", "1GiB"))
    procs = []
    try:
        env = dict(os.environ, PYTHONUNBUFFERED="1", LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock,
                   VLAKE_LOG="info")
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        cmd = [sys.executable, "-c", PROGRAM]
        a = Proc(cmd, env, os.path.join(work, "a.err"), group=GID_A)
        b = Proc(cmd, env, os.path.join(work, "b.err"), group=GID_B)
        c = Proc(cmd, env, os.path.join(work, "c.err"), group=GID_C)
        procs += [a, b, c]
        ra, rb, rc_ = a.next(), b.next(), c.next()
        check("the tenants run with their groups",
              (ra.get("gid"), rb.get("gid"), rc_.get("gid")) == (GID_A, GID_B, GID_C), "%s %s %s" % (ra, rb, rc_))
        # The host tier is made ahead (pinning takes about 0.2 s/GiB): wait for it.
        t0 = time.monotonic()
        stock = 0
        while time.monotonic() - t0 < 300:
            stock = ns.state_json(args.state_tool, daemon.state)["counters"]["host_stock_bytes"]
            if stock >= a_bytes:
                break
            time.sleep(0.5)
        print("host tier stock %.1f GiB made in %.1f s (bound %.1f GiB)" % (stock / GiB, time.monotonic() - t0,
                                                                            bound / GiB), flush=True)
        check("the host tier's stock covers A (%.1f GiB of %.1f GiB)" % (stock / GiB, a_bytes / GiB),
              stock >= a_bytes, "")
        if c_bytes > 0:
            c.send("alloc %d\n" % c_bytes)
            ac = c.next()
            check("C holds %.1f GiB (the GPU as tight as an 80 GB card)" % (c_bytes / GiB), ac["ok"], str(ac))
        a.send("fill %d\n" % a_bytes)
        fa = a.next()
        a.send("sums %d\n" % args.loops)
        on_gpu = a.next()
        check("A filled %.1f GiB; its sums on the GPU are right" % (a_bytes / GiB),
              fa["bytes"] == a_bytes and all(s == fa["sum"] for s in on_gpu["sums"]), str(on_gpu))
        used_a = nv.memory()["used"]
        time.sleep(5.0)  # A idle

        # --- B needs what A holds: A's allocation moves to the host tier, A runs on ---
        # A timeline while B waits: when vlaked published A's allocation on the host.
        import threading
        timeline = {}
        t_send = time.monotonic()
        stop_poll = threading.Event()

        def poll():
            while not stop_poll.is_set():
                try:
                    hb_ = host_bytes(args, daemon, ra["pid"])
                except Exception:
                    hb_ = None
                if hb_ == a_bytes and "demoted" not in timeline:
                    timeline["demoted"] = time.monotonic() - t_send
                time.sleep(0.02)
        poller = threading.Thread(target=poll)
        poller.start()
        b.send("alloc %d\n" % a_bytes)
        ab = b.next()
        stop_poll.set()
        poller.join()
        print("timeline: B asked at 0; A's allocation published on the host at %s s; B served at %.2f s"
              % ("%.2f" % timeline["demoted"] if "demoted" in timeline else "-", ab["ms"] / 1e3), flush=True)
        check("B's %.1f GiB are served in %.2f s (done when: <= 2.5 s)" % (a_bytes / GiB, ab["ms"] / 1e3),
              ab["ok"] and ab["ms"] <= 2500, str(ab))
        hb = host_bytes(args, daemon, ra["pid"])
        hc = vlakectl_host(args, daemon, ra["pid"])
        check("vlaked shows A's %.1f GiB on the host exactly (state %s, vlakectl %s; +-2 MiB)"
              % (a_bytes / GiB, hb, hc),
              hb is not None and hc is not None and abs(hb - a_bytes) <= 2 * MiB and hc == hb, "")
        used_b = nv.memory()["used"]
        check("NVML: the GPU holds B's %.1f GiB without A's (used %.1f GiB, with A before B: %.1f GiB)"
              % (a_bytes / GiB, used_b / GiB, used_a / GiB), used_b < used_a + a_bytes - 2 * GiB, "")
        a.send("sums %d\n" % args.loops)
        on_host = a.next()
        check("A keeps running while demoted: %d sums over its %.1f GiB on the host are right"
              % (args.loops, a_bytes / GiB),
              all(s == fa["sum"] for s in on_host["sums"]) and on_host["ptr"] == fa["ptr"], str(on_host))
        gpu_ms = sorted(on_gpu["ms"])[len(on_gpu["ms"]) // 2]
        host_ms = sorted(on_host["ms"])[len(on_host["ms"]) // 2]
        print("A's sum: %.1f ms on the GPU, %.1f ms on the host tier (median of %d): slowdown %.1fx; "
              "%.1f GB/s over PCIe" % (gpu_ms, host_ms, args.loops, host_ms / gpu_ms, a_bytes / (host_ms / 1e3) / 1e9),
              flush=True)

        # --- B frees: A comes back ---
        t1 = time.monotonic()  # from B's free: its release starts the promote
        b.send("free\n")
        b.next()
        back = None
        while time.monotonic() - t1 < 30:
            if host_bytes(args, daemon, ra["pid"]) == 0:
                back = time.monotonic() - t1
                break
            time.sleep(0.05)
        check("A's memory is back on the GPU in %s s (done when: <= 2 s)" % ("%.2f" % back if back else "-"),
              back is not None and back <= 2.0, "")
        time.sleep(0.3)
        used_back = nv.memory()["used"]
        a.send("sums %d\n" % args.loops)
        again = a.next()
        check("A's checksum is intact after the round trip, at GPU speed again (%.1f ms)"
              % sorted(again["ms"])[len(again["ms"]) // 2],
              all(s == fa["sum"] for s in again["sums"]) and again["ptr"] == fa["ptr"], str(again))
        check("NVML: A's memory is on the GPU again (used %.1f GiB, B freed)" % (used_back / GiB),
              used_back >= a_bytes + c_bytes, "")
        with open(os.path.join(work, "vlaked.log")) as f:
            log = f.read()
        moves = re.findall(r"grant\(s\) \((\d+) MiB\) moved to (host|GPU) memory on GPU \d+ in (\d+) ms", log)
        for mib, where, ms in moves:
            print("move to %s: %s MiB in %s ms = %.3f s/GiB" % (where, mib, ms, int(ms) / 1e3 / (int(mib) / 1024)),
                  flush=True)
        demote = [m for m in moves if m[1] == "host"]
        promote = [m for m in moves if m[1] == "GPU"]
        check("one demote and one promote, each <= 0.05 s/GiB end to end (%s)" % moves,
              len(demote) == 1 and len(promote) == 1 and
              all(int(ms) / 1e3 / (int(mib) / 1024) <= 0.05 for mib, _, ms in moves), "")
        check("nothing was checkpointed", "swapping out session" not in log, "")
        with open(os.path.join(work, "a.err")) as f:
            for line in f:
                if "vlaked moved" in line:
                    print("A: " + line.strip(), flush=True)
    finally:
        for x in procs:
            x.end(timeout=60)
        ns.clean_up(check, daemon, work)
    return check.verdict("tier_torch")


if __name__ == "__main__":
    sys.exit(main())
