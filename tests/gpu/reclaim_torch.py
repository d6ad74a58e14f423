#!/usr/bin/env python3
"""Reclaim from PyTorch's cache on a real GPU (docs/hook.md, "Reclaim"), checked with NVML.

Two tenants under vlaked, told apart by their primary group (namespaces `low`, priority 0, and
`high`, priority 10; both run as this uid, so both can import torch):
  1. L (low) allocates 60 % of the GPU with PyTorch, fills it and frees the tensor: PyTorch keeps
     it cached; NVML's used memory rises by about that much;
  2. H (high) asks PyTorch for 50 % of the GPU: refused (CUDA out of memory), since L has not
     enabled reclaim and the two do not fit together;
  3. L calls vlake.torch.enable_reclaim() and goes idle; H asks again: its allocation succeeds
     within 2 s, L ran empty_cache() once (torch.cuda.memory_reserved() fell to 0), and NVML's
     used memory holds H's 50 % without L's 60 % (the GPU cannot hold both);
  4. L continues: it allocates 1 GiB, computes on it and gets the right answer.
Needs root (to start the tenants with another primary group); exit 77 (skipped) without a GPU
and PyTorch.

  reclaim_torch.py --vlaked PATH --hook PATH --state-tool PATH
"""
import os
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

GID_LOW, GID_HIGH = 64301, 64302

PROGRAM = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import torch, vlake
def out(**kw):
    print(json.dumps(kw), flush=True)
torch.cuda.init()
out(event="ready", gid=os.getgid())
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "cache":  # allocate, touch and free: PyTorch keeps it cached
        x = torch.empty(int(cmd[1]), dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        del x
        out(event="cached", reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated())
    elif cmd[0] == "reclaim":
        vlake.torch.enable_reclaim()
        out(event="reclaim")
    elif cmd[0] == "alloc":
        t = time.monotonic()
        try:
            y = torch.empty(int(cmd[1]), dtype=torch.uint8, device="cuda")
            y.fill_(2)
            torch.cuda.synchronize()
            keep = globals().setdefault("keep", [])
            keep.append(y)
            out(event="alloc", ok=True, ms=(time.monotonic() - t) * 1e3)
        except torch.OutOfMemoryError as e:
            out(event="alloc", ok=False, ms=(time.monotonic() - t) * 1e3, error=str(e).splitlines()[0][:200])
    elif cmd[0] == "work":  # 1 GiB of float32, summed
        z = torch.ones(1 << 28, device="cuda")
        s = float(z.sum().item())
        out(event="work", ok=s == float(1 << 28), reserved=torch.cuda.memory_reserved())
    elif cmd[0] == "stats":
        out(event="stats", reserved=torch.cuda.memory_reserved(), count=vlake.reclaim_count())
"""


def main():
    args = testprocs.tool_args("--vlaked", "--hook", "--state-tool")
    rc = torch_gpu_as_root("reclaim_torch")
    if rc is not None:
        return rc
    from nvml import Nvml
    nv = Nvml(0)
    total = nv.memory()["total"]
    check = Checks()
    work = tempfile.mkdtemp(prefix="vlake-reclaim-torch-")
    os.chmod(work, 0o755)
    config = ("version: 1\ndefault:\n  limit: 100%%\nnamespaces:\n"
              "  - {name: low, priority: 0, groups: [%d]}\n  - {name: high, priority: 10, groups: [%d]}\n"
              % (GID_LOW, GID_HIGH))
    daemon = ns.Daemon(args.vlaked, work, config, ("--pool-idle-release", "1s", "--pressure-wait-ms", "5000",
                                                  "--warm-stock", "0"))
    procs = []
    try:
        env = dict(os.environ, PYTHONUNBUFFERED="1", LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)

        # Both keep this uid (so both import torch); their primary groups make them two tenants.
        cmd = [sys.executable, "-c", PROGRAM, os.path.join(ROOT, "python")]
        low = Proc(cmd, env, os.path.join(work, "low.err"), group=GID_LOW)
        high = Proc(cmd, env, os.path.join(work, "high.err"), group=GID_HIGH)
        procs += [low, high]
        r = low.next(), high.next()
        check("the tenants run with their groups", r[0].get("gid") == GID_LOW and r[1].get("gid") == GID_HIGH, str(r))
        time.sleep(1.5)
        base = nv.memory()["used"]

        l_bytes = int(total * 0.60) // (2 * MiB) * (2 * MiB)
        h_bytes = int(total * 0.50) // (2 * MiB) * (2 * MiB)
        low.send("cache %d\n" % l_bytes)
        c = low.next()
        time.sleep(1.5)
        used1 = nv.memory()["used"] - base
        check("L's cache: PyTorch keeps %.1f GiB reserved, NVML +%.1f GiB" % (c["reserved"] / GiB, used1 / GiB),
              c["reserved"] >= l_bytes and c["allocated"] == 0 and used1 >= l_bytes - 256 * MiB,
              str(c))

        high.send("alloc %d\n" % h_bytes)
        a = high.next()
        check("without reclaim, H's %.1f GiB is refused (out of memory)" % (h_bytes / GiB), not a["ok"],
              "%s" % a)

        low.send("reclaim\n")
        low.next()
        time.sleep(0.5)  # L's report that it can reclaim
        high.send("alloc %d\n" % h_bytes)
        a = high.next()
        # The wait covers L's empty_cache(), the release of what it freed and a new handle of H's
        # size (created and zeroed): 204-282 ms for 39.8 GiB on an H100.
        check("with reclaim, H's %.1f GiB succeeds within 2 s (%.0f ms)" % (h_bytes / GiB, a["ms"]),
              a["ok"] and a["ms"] < 2000, str(a))
        low.send("stats\n")
        s = low.next()
        check("L emptied its cache once", s["count"] == 1 and s["reserved"] == 0, str(s))
        time.sleep(2.5)  # the idle release (1 s) and NVML
        used2 = nv.memory()["used"] - base
        check("NVML: +%.1f GiB, H's %.1f GiB without L's %.1f GiB" % (used2 / GiB, h_bytes / GiB, l_bytes / GiB),
              h_bytes - 256 * MiB <= used2 < h_bytes + 2 * GiB, "used over baseline %d MiB" % (used2 // MiB))
        low.send("work\n")
        w = low.next()
        check("L continues: 1 GiB allocated and summed correctly", w["ok"], str(w))
        st = ns.state_json(args.state_tool, daemon.state)
        d = [x for x in st["devices"] if x["ordinal"] == 0][0]
        print("vlaked: granted %.1f GiB at the end" % (d["granted_bytes"] / GiB), flush=True)
    finally:
        for p in procs:
            p.end()
        ns.clean_up(check, daemon, work)
    return check.verdict("reclaim_torch")


if __name__ == "__main__":
    sys.exit(main())
