#!/usr/bin/env python3
"""Swapping an idle PyTorch tenant to host memory and back (docs/swap.md), checked with NVML.

Three tenants under vlaked (--swap-idle 1s), told apart by their primary group:
  O and N in namespace `nb` (`overcommit: true`: their memory is their own driver's, counted),
  P in namespace `pool` (memory mapped from vlaked's pool, the default).
  1. O fills 15 % of the GPU with a pattern (checksum noted) and goes idle.
  2. N asks PyTorch for 85 % of the GPU, which cannot fit next to O: vlaked checkpoints O (the
     driver's checkpoint API) and N's allocation succeeds; NVML's used memory then holds N's
     tensor without O's, and O is not in NVML's process list. vlaked still charges O's bytes.
  3. N frees its tensor; O computes its checksum again: its first CUDA call brings it back (the
     hook's gate asks vlaked, which restores it), the checksum is the same, NVML shows O's
     memory again.
  4. P (pool memory): the driver checkpoints it (driven here through ctypes) but its pool memory
     stays on the GPU (vlaked holds the handles) and restore fails: driver 580 cannot restore
     memory a process imported (measured; why pool tenants are not swapped). P is killed.
Seconds per GiB of checkpoint and restore are printed. Needs root (tenants with other primary
groups); exit 77 (skipped) without a GPU, PyTorch or the driver's checkpoint API.

  swap_torch.py --vlaked PATH --hook PATH --state-tool PATH
"""
import ctypes
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from checks import GiB, MiB, Checks, testprocs, torch_gpu_as_root  # noqa: E402
import node_slice as ns  # noqa: E402
from dedup_nvml import Proc  # noqa: E402

GID_O, GID_N, GID_P = 64311, 64313, 64312

PROGRAM = r"""
import json, os, sys, time
import torch
def out(**kw):
    print(json.dumps(kw), flush=True)
torch.cuda.init()
out(event="ready", gid=os.getgid(), pid=os.getpid())
x = None
for line in sys.stdin:
    cmd = line.split()
    t = time.monotonic()
    if cmd[0] == "fill":
        n = int(cmd[1]) // 4
        x = torch.arange(n, dtype=torch.int32, device="cuda")
        x.mul_(7).add_(3)  # in place: no temporaries of the tensor's size
        s = int(x.sum(dtype=torch.int64).item())
        torch.cuda.empty_cache()  # the sum's temporaries: the process keeps its tensor only
        out(event="filled", sum=s, bytes=n * 4)
    elif cmd[0] == "sum":
        s = int(x.sum(dtype=torch.int64).item())
        ms = (time.monotonic() - t) * 1e3
        torch.cuda.empty_cache()
        out(event="sum", sum=s, ms=ms)
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


class Checkpoint:
    """The driver's process checkpoint API through ctypes (cuda.h, CUDA_CHECKPOINT)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.ok = all(hasattr(self.lib, n) for n in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                                                     "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"))
        if self.ok:
            self.lib.cuInit(0)

    def _call(self, name, pid, args=None):
        t = time.monotonic()
        rc = getattr(self.lib, name)(ctypes.c_int(pid), args)
        return rc, time.monotonic() - t

    def lock(self, pid):
        class LockArgs(ctypes.Structure):
            _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]
        a = LockArgs()
        a.timeoutMs = 10000
        return self._call("cuCheckpointProcessLock", pid, ctypes.byref(a))

    def checkpoint(self, pid):
        return self._call("cuCheckpointProcessCheckpoint", pid)

    def restore(self, pid):
        return self._call("cuCheckpointProcessRestore", pid)

    def unlock(self, pid):
        return self._call("cuCheckpointProcessUnlock", pid)


def main():
    args = testprocs.tool_args("--vlaked", "--hook", "--state-tool")
    rc = torch_gpu_as_root("swap_torch")
    if rc is not None:
        return rc
    cp = Checkpoint()
    if not cp.ok:
        print("SKIP: this driver has no process checkpoint API")
        return 77
    from nvml import Nvml
    nv = Nvml(0)
    total = nv.memory()["total"]
    check = Checks()
    work = tempfile.mkdtemp(prefix="vlake-swap-torch-")
    os.chmod(work, 0o755)
    config = ("version: 1\ndefault:\n  limit: 100%%\nnamespaces:\n"
              "  - {name: nb, overcommit: true, groups: [%d, %d]}\n  - {name: pool, groups: [%d]}\n"
              % (GID_O, GID_N, GID_P))
    daemon = ns.Daemon(args.vlaked, work, config, ("--warm-stock", "0", "--swap-idle", "1s"))
    procs = []
    try:
        env = dict(os.environ, PYTHONUNBUFFERED="1", LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock,
                   VLAKE_LOG="info")
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        cmd = [sys.executable, "-c", PROGRAM]
        o = Proc(cmd, env, os.path.join(work, "o.err"), group=GID_O)
        n = Proc(cmd, env, os.path.join(work, "n.err"), group=GID_N)
        p = Proc(cmd, env, os.path.join(work, "p.err"), group=GID_P)
        procs += [o, n, p]
        ro, rn, rp = o.next(), n.next(), p.next()
        check("the tenants run with their groups",
              (ro.get("gid"), rn.get("gid"), rp.get("gid")) == (GID_O, GID_N, GID_P), "%s %s %s" % (ro, rn, rp))
        time.sleep(1.0)
        base = nv.memory()["used"]
        o_bytes = int(total * 0.15) // (2 * MiB) * (2 * MiB)
        n_bytes = int(total * 0.85) // (2 * MiB) * (2 * MiB)
        o.send("fill %d\n" % o_bytes)
        fo = o.next()
        time.sleep(1.0)
        used_o = nv.memory()["used"] - base
        o_nvml = nv.processes().get(ro["pid"], 0)
        st = ns.state_json(args.state_tool, daemon.state)
        d = [x for x in st["devices"] if x["ordinal"] == 0][0]
        check("O's %.1f GiB are its own driver's, counted (vlaked counted %.1f GiB, pool granted %.1f GiB); NVML +%.1f GiB"
              % (o_bytes / GiB, d["counted_bytes"] / GiB, d["granted_bytes"] / GiB, used_o / GiB),
              d["counted_bytes"] >= o_bytes and d["granted_bytes"] == 0 and used_o >= o_bytes, "")

        # --- N needs what O holds: O is swapped out ---
        time.sleep(2.0)  # O idle for more than --swap-idle
        n.send("alloc %d\n" % n_bytes)
        an = n.next()
        time.sleep(0.5)
        used_n = nv.memory()["used"] - base
        procs_n = nv.processes()
        st = ns.state_json(args.state_tool, daemon.state)
        d = [x for x in st["devices"] if x["ordinal"] == 0][0]
        check("N's %.1f GiB succeed after O is moved to the host (%.1f s)" % (n_bytes / GiB, an["ms"] / 1e3),
              an["ok"], str(an))
        check("NVML +%.1f GiB: N's %.1f GiB without O's %.1f GiB; O not in NVML's list"
              % (used_n / GiB, n_bytes / GiB, o_bytes / GiB),
              n_bytes <= used_n < n_bytes + o_bytes and ro["pid"] not in procs_n, "processes %s" % procs_n)
        check("vlaked still charges O's %.1f GiB to its quota (counted %.1f GiB)" % (o_bytes / GiB,
              d["counted_bytes"] / GiB), d["counted_bytes"] >= o_bytes + n_bytes, "")

        # --- N frees; O's next call brings it back ---
        n.send("free\n")
        n.next()
        time.sleep(0.5)
        o.send("sum\n")
        so = o.next()
        time.sleep(0.5)
        used_back = nv.memory()["used"] - base
        check("O comes back on its next call (%.1f s) with its checksum intact" % (so["ms"] / 1e3),
              so["sum"] == fo["sum"], "before %d after %d" % (fo["sum"], so["sum"]))
        o_back = nv.processes().get(ro["pid"], 0)
        check("NVML: O holds %.2f GiB again (%.2f GiB before it left); the GPU +%.1f GiB" % (
              o_back / GiB, o_nvml / GiB, used_back / GiB),
              abs(o_back - o_nvml) <= 256 * MiB and used_back >= o_bytes, str(nv.processes()))
        with open(os.path.join(work, "vlaked.log")) as f:
            log = f.read()
        outs = re.findall(r"is on the host: (\d+) MiB freed on GPU \d+ in (\d+) ms", log)
        ins = re.findall(r"is back on GPU \d+ after (\d+) ms \((\d+) MiB, restore (\d+) ms\)", log)
        check("vlaked swapped O out once and back once", len(outs) == 1 and len(ins) == 1, "%s %s" % (outs, ins))
        if outs and ins:
            print("checkpoint: %s MiB in %s ms = %.2f s/GiB; restore: %s MiB in %s ms = %.2f s/GiB; O's call waited %s ms"
                  % (outs[0][0], outs[0][1], int(outs[0][1]) / 1e3 / (int(outs[0][0]) / 1024), ins[0][1], ins[0][2],
                     int(ins[0][2]) / 1e3 / (int(ins[0][1]) / 1024), ins[0][0]), flush=True)

        # --- P: pool memory cannot be restored on this driver ---
        p.send("fill %d\n" % o_bytes)
        fp = p.next()
        time.sleep(0.5)
        before = nv.memory()["used"]
        rc_l, _ = cp.lock(rp["pid"])
        rc_c, t_c = cp.checkpoint(rp["pid"])
        time.sleep(0.5)
        freed = before - nv.memory()["used"]
        check("P (pool) checkpointed (lock %d, checkpoint %d) but its pool memory stays: NVML -%.2f GiB of %.2f GiB"
              % (rc_l, rc_c, freed / GiB, o_bytes / GiB), rc_l == 0 and rc_c == 0 and freed < o_bytes, "")
        rc_r, _ = cp.restore(rp["pid"])
        check("P cannot be restored (imported memory; driver result %d, 801 = not supported)" % rc_r, rc_r != 0, "")
        check("P had filled its tensor", fp["bytes"] == o_bytes, str(fp))
    finally:
        for x in procs[2:]:
            if x.p.poll() is None:
                x.p.kill()  # P stays checkpointed for good
        for x in procs:
            x.end(timeout=30)
        ns.clean_up(check, daemon, work)
    return check.verdict("swap_torch")


if __name__ == "__main__":
    sys.exit(main())
