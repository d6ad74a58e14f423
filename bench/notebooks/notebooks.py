#!/usr/bin/env python3
"""Notebooks sharing one GPU (docs/notebooks.md): N simulated users, each a Python process with
PyTorch that loads a model and runs short bursts of work separated by idle periods, each its own
tenant (its own primary group) with a limit of FACTOR x the GPU's memory / N, so that the limits
add up to FACTOR x the GPU. Run once with reclaim off and once with it on (vlake.torch.
enable_reclaim()), same seeds:

  - bursts done, bursts that hit CUDA out of memory (PyTorch's OutOfMemoryError, after vlaked
    refused), reclaims run (vlake.reclaim_count() summed), the bursts' duration p50/p99;
  - every burst's output (a checksum of its result) against the run with reclaim on: identical;
  - NVML's highest used memory over the baseline, sampled every 100 ms.

With --check: exit 1 unless the run with reclaim on had 0 OOM and the outputs match the run
without reclaim wherever both completed, and the run without reclaim had at least one OOM (the
workload really needs the memory idle notebooks hold).

With --overcommit (docs/swap.md; --factor defaults to 2.0 then): the users' namespace has
`overcommit: true` and reclaim is on; vlaked (--swap-idle 1s) moves idle users to host memory when
the GPU is full, and their next CUDA call brings them back. It runs the users one at a time
without vlake first ("alone": the GPU to itself, no idle periods), then all of them at once, and
reports swap-outs and swap-ins (vlaked's log), the time a burst's first call waited for its
restore (p50/p99, the users' own lines) and seconds per GiB of checkpoint and restore. --check:
0 OOM, every burst done, outputs identical to the run alone, and at least one swap-out.

With --host-tier SIZE (docs/swap.md, "Host tier"; implies --overcommit): vlaked keeps SIZE of pinned
host memory made ahead (--state-tool PATH: the run starts once it is made) and moves idle users'
allocations there at the same addresses while they keep running, instead of checkpointing them.
It reports demotes and promotes (vlaked's log: count, GiB, seconds per GiB end to end), how long
each move held a user's threads at the hook's gate (the users' own lines: the tier's counterpart
of a restore wait), and each burst's time against the same burst alone. --check: 0 OOM, every
burst done, outputs identical to the run alone, at least one demote, no failed move, the holds'
p99 <= 2 s, demotes and promotes each <= 0.05 s/GiB over the run, and no checkpoint.

With --vlakectl PATH, what vlake shows is checked against NVML while the users run (every 250 ms:
`vlakectl processes --json` and `vlakectl waits --json` beside NVML's process list): a process
vlakectl shows on the host is not in NVML's list (read again after NVML, so that a restore in
between does not count); waits name the processes being swapped out for them; idle times cover
the users' idle periods; and vlakectl's swap counters at the end equal vlaked's log. --check then
also fails on any of these.

Needs root (primary groups); exit 77 without a GPU and PyTorch.

  notebooks.py --vlaked PATH --hook PATH [--vlakectl PATH] [--users 8] [--factor 1.3] [--rounds 5] [--overcommit]
               [--host-tier SIZE [--state-tool PATH]] [--json OUT] [--check]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
import node_slice as ns  # noqa: E402
from checks import torch_gpu_as_root  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
GID0 = 64400

USER = r"""
import faulthandler, json, os, random, signal, sys, time
faulthandler.register(signal.SIGUSR1)  # the run's watchdog asks where a stuck user is
sys.path.insert(0, sys.argv[1])
import torch, vlake
uid, limit, rounds, reclaim = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "on"
idle = sys.argv[6] == "idle"
rng = random.Random(uid)
gen = torch.Generator(device="cuda").manual_seed(uid)
if reclaim:
    vlake.torch.enable_reclaim()
# The model: 30 % of the limit in float16 weights (n x n matrices).
n = 4096
mat = n * n * 2
model = [torch.randn(n, n, device="cuda", dtype=torch.float16, generator=gen) * 0.01
         for _ in range(max(1, int(limit * 0.30) // mat))]
torch.cuda.synchronize()
print(json.dumps({"event": "loaded", "model_bytes": len(model) * mat}), flush=True)
bursts = []
for r in range(rounds):
    pause = rng.uniform(0.5, 3.0)  # idle: the notebook's user reads, thinks, types
    if idle:
        time.sleep(pause)
    t = time.monotonic()
    gen.manual_seed(uid * 1000 + r)  # the same input whatever happened to earlier bursts
    try:
        # A burst: activations of 55 % of the limit (kept alive together), then freed; PyTorch caches them.
        acts = []
        x = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=gen)
        for i in range(max(1, int(limit * 0.55) // mat)):
            x = torch.tanh(x @ model[i % len(model)])
            acts.append(x)
        s = float(torch.stack([a.float().sum() for a in acts]).sum().item())
        del acts, x
        bursts.append({"round": r, "ok": True, "ms": (time.monotonic() - t) * 1e3, "sum": s})
    except torch.OutOfMemoryError as e:
        acts = x = None
        bursts.append({"round": r, "ok": False, "ms": (time.monotonic() - t) * 1e3, "error": str(e)[:160]})
print(json.dumps({"event": "done", "bursts": bursts, "reclaims": vlake.reclaim_count() if vlake.available() else 0,
                  "reserved": torch.cuda.memory_reserved()}), flush=True)
"""


def quantile(v, f):
    """The f-quantile of the sorted list v (None when empty)."""
    return v[min(len(v) - 1, int(f * len(v)))] if v else None


def run_alone(args, work, total):
    """Each user by itself, without vlake and without idle periods: the reference outputs."""
    limit = int(total * args.factor / args.users) // (2 * MiB) * (2 * MiB)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for k in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    outs = {}
    t0 = time.monotonic()
    print("notebooks: each user alone (no vlake)", file=sys.stderr, flush=True)
    for i in range(args.users):
        p = subprocess.run([sys.executable, "-c", USER, os.path.join(ROOT, "python"), str(i), str(limit),
                            str(args.rounds), "off", "busy"], env=env, capture_output=True, text=True)
        done = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{") and '"done"' in x]
        if not done:
            raise RuntimeError("user %d alone failed (exit %s):\n%s" % (i, p.returncode, p.stderr[-2000:]))
        outs[i] = done[0]
    print("notebooks: the users alone took %.0f s" % (time.monotonic() - t0), file=sys.stderr, flush=True)
    bursts = [b for o in outs.values() for b in o["bursts"]]
    return {"reclaim": "alone", "users": args.users, "factor": args.factor, "limit_bytes": limit,
            "bursts": len(bursts), "completed": sum(1 for b in bursts if b["ok"]),
            "oom": sum(1 for b in bursts if not b["ok"]), "wall_s": time.monotonic() - t0,
            "sums": {"%d/%d" % (i, b["round"]): b["sum"] for i, o in outs.items() for b in o["bursts"] if b["ok"]},
            "ms": {"%d/%d" % (i, b["round"]): b["ms"] for i, o in outs.items() for b in o["bursts"] if b["ok"]}}


def tier_figures(log, user_lines):
    """Demotes and promotes from vlaked's log; how long each move held a user's threads, from the
    users' own lines (the hook's "vlaked moved ... in N ms")."""
    moves = [(d, mib, ms) for d, mib, ms in
             ((m.group(2), int(m.group(1)), int(m.group(3))) for m in
              (re.search(r"grant\(s\) \((\d+) MiB\) moved to (host|GPU) memory on GPU \d+ in (\d+) ms", x)
               for x in log) if m)]
    # The gate is shut from the stop (the "stopping" part) to the end of the move.
    holds = sorted(int(m.group(1)) + int(m.group(2)) for m in
                   (re.search(r"vlaked moved \d+ allocation\(s\) of this process \(.*\) to \w+ memory in (\d+) ms "
                              r"\(stopping (\d+)", x) for x in user_lines) if m)

    def side(direction):
        mine = [(mib, ms) for d, mib, ms in moves if d == direction]
        gib = sum(mib for mib, _ in mine) / 1024
        return {"count": len(mine), "gib": gib,
                "s_per_gib": (sum(ms for _, ms in mine) / 1e3) / gib if gib > 0 else None}
    return {"demotes": side("host"), "promotes": side("GPU"), "holds": len(holds),
            "hold_ms_p50": quantile(holds, 0.50), "hold_ms_p99": quantile(holds, 0.99),
            "hold_ms_max": holds[-1] if holds else None,
            "failed": sum(1 for x in user_lines if "host tier: moving grant" in x and "failed" in x)
            + sum(1 for x in log if "host tier move got no answer" in x),
            "checkpoints": sum(1 for x in log if re.search(r"is on the host: \d+ MiB freed", x))}


def swap_figures(log, user_lines):
    """Swap-outs and swap-ins from vlaked's log, restore waits from the users' own lines."""
    outs = [(int(m.group(1)), int(m.group(2))) for m in
            (re.search(r"is on the host: (\d+) MiB freed on GPU \d+ in (\d+) ms", x) for x in log) if m]
    ins = [(int(m.group(1)), int(m.group(2))) for m in
           (re.search(r"is back on GPU \d+ after \d+ ms \((\d+) MiB, restore (\d+) ms\)", x) for x in log) if m]
    waits = sorted(int(m.group(1)) for m in (re.search(r"back on the GPU after (\d+) ms", x) for x in user_lines) if m)
    per_gib = lambda pairs: (sum(ms for _, ms in pairs) / 1e3) / (sum(mib for mib, _ in pairs) / 1024) \
        if pairs and sum(mib for mib, _ in pairs) > 0 else None
    return {"swap_outs": len(outs), "swap_ins": len(ins), "swapped_gib": sum(m for m, _ in outs) / 1024,
            "restore_wait_ms_p50": quantile(waits, 0.50), "restore_wait_ms_p99": quantile(waits, 0.99),
            "restore_wait_ms_max": waits[-1] if waits else None, "restore_waits": len(waits),
            "checkpoint_s_per_gib": per_gib(outs), "restore_s_per_gib": per_gib(ins),
            "swap_failures": sum(1 for x in log if "checkpoint failed" in x or "restore failed" in x),
            "stayed_on_host": sum(1 for x in log if "stays on the host" in x)}


def ctl_json(vlakectl, state, *cmd):
    out = subprocess.run([vlakectl, "--state", state, "--json", *cmd], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise RuntimeError("vlakectl %s: %s" % (" ".join(cmd), out.stderr.strip()))
    return json.loads(out.stdout)


class Observer:
    """vlakectl's view of the users against NVML's, sampled while they run (--vlakectl)."""

    def __init__(self, vlakectl, state, nv, pids):
        self.vlakectl, self.state, self.nv, self.pids = vlakectl, state, nv, pids
        self.samples = 0
        self.host_seen = 0            # (sample, pid) pairs vlakectl showed on the host
        self.host_but_listed = []     # of those, NVML listed the pid (and vlakectl still said host after)
        self.gpu_listed = 0           # pids on the GPU with memory that NVML listed
        self.waits_seen = 0           # (sample, waiter) pairs
        self.waits_for_swapping = 0   # of those, naming a process being swapped out for it
        self.max_waiting = 0
        self.tier_seen = 0            # (sample, pid) pairs vlakectl showed with memory on the host tier
        self.tier_max = 0             # the most bytes on the host tier at once (the processes' sum)
        self.idle_max = 0.0
        self.errors = []

    def sample(self):
        procs = ctl_json(self.vlakectl, self.state, "processes")["processes"]
        listed = self.nv.processes()
        after = {p["pid"]: p for p in ctl_json(self.vlakectl, self.state, "processes")["processes"]}
        waits = ctl_json(self.vlakectl, self.state, "waits")["waits"]
        self.samples += 1
        on_tier = sum(p.get("host_bytes", 0) for p in procs if p["pid"] in self.pids)
        self.tier_max = max(self.tier_max, on_tier)
        self.tier_seen += sum(1 for p in procs if p["pid"] in self.pids and p.get("host_bytes", 0) > 0)
        for p in procs:
            if p["pid"] not in self.pids:
                continue
            if p["idle_seconds"] is not None:
                self.idle_max = max(self.idle_max, p["idle_seconds"])
            if p["swap"]["state"] == "host":
                self.host_seen += 1
                still = after.get(p["pid"], {}).get("swap", {}).get("state") == "host"
                if p["pid"] in listed and still:
                    self.host_but_listed.append((p["pid"], listed[p["pid"]]))
            elif p["swap"]["state"] == "gpu" and p["grants"] > 0 and p["pid"] in listed:
                self.gpu_listed += 1
        self.max_waiting = max(self.max_waiting, len(waits))
        for w in waits:
            self.waits_seen += 1
            if any(f["why"] == "swapping out" and f["pid"] in self.pids for f in w["waits_for"]):
                self.waits_for_swapping += 1

    def run(self, stop):
        while not stop.wait(0.25):
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 - reported with the results
                if len(self.errors) < 5:
                    self.errors.append(str(e))

    def figures(self):
        return {"samples": self.samples, "host_seen": self.host_seen, "host_but_listed": self.host_but_listed[:8],
                "gpu_listed": self.gpu_listed, "waits_seen": self.waits_seen,
                "waits_for_swapping": self.waits_for_swapping, "max_waiting": self.max_waiting,
                "idle_max_s": self.idle_max, "tier_seen": self.tier_seen, "tier_max_bytes": self.tier_max,
                "errors": self.errors}


def run_mode(args, work, total, reclaim):
    from nvml import Nvml
    nv = Nvml(0)
    tier = reclaim == "tier"
    overcommit = reclaim == "overcommit" or tier
    limit = int(total * args.factor / args.users) // (2 * MiB) * (2 * MiB)
    config = "version: 1\ndefault:\n  limit: %dMiB\n" % (limit // MiB)
    if overcommit:
        config += "  overcommit: true\n"
    config += "groups:\n"
    config += "".join("  - {gid: %d, limit: %dMiB}\n" % (GID0 + i, limit // MiB) for i in range(args.users))
    d = os.path.join(work, "reclaim-" + reclaim)
    os.mkdir(d)
    os.chmod(d, 0o755)
    flags = ("--pressure-wait-ms", "10000", "--pool-idle-release", "2s", "--warm-stock", "0")
    if overcommit:
        flags += ("--swap-idle", "1s")
    if tier:
        flags += ("--host-tier", args.host_tier)
    daemon = ns.Daemon(args.vlaked, d, config, flags)
    procs, outs = [], {}
    peak = [0]
    stop = threading.Event()
    stock = None
    try:
        time.sleep(1.0)
        if tier and args.state_tool:
            # The host tier is made ahead (pinning takes about 0.2 s/GiB): the users start once it is.
            t_stock = time.monotonic()
            while True:
                c = ns.state_json(args.state_tool, daemon.state)["counters"]
                if c["host_stock_bytes"] >= c["host_bound_bytes"] > 0 or time.monotonic() - t_stock > 90:
                    break
                time.sleep(0.25)
            stock = {"bytes": c["host_stock_bytes"], "bound": c["host_bound_bytes"],
                     "s": time.monotonic() - t_stock}
            print("notebooks: host tier stock %.1f GiB of %.1f GiB made in %.1f s" % (
                stock["bytes"] / GiB, stock["bound"] / GiB, stock["s"]), file=sys.stderr, flush=True)
        base = nv.memory()["used"]

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], nv.memory()["used"] - base)
                time.sleep(0.1)
        threading.Thread(target=sample, daemon=True).start()
        env = dict(os.environ, PYTHONUNBUFFERED="1", LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock,
                   VLAKE_LOG="info")
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        t0 = time.monotonic()
        print("notebooks: %d users at once, %s" % (args.users, reclaim), file=sys.stderr, flush=True)
        for i in range(args.users):
            err = open(os.path.join(d, "user%d.err" % i), "w")
            p = subprocess.Popen([sys.executable, "-c", USER, os.path.join(ROOT, "python"), str(i), str(limit),
                                  str(args.rounds), "off" if reclaim == "off" else "on", "idle"], env=env,
                                 stdout=subprocess.PIPE, stderr=err, text=True, group=GID0 + i, extra_groups=[])
            procs.append((p, err))
        observer = None
        if args.vlakectl:
            observer = Observer(args.vlakectl, daemon.state, nv, {p.pid for p, _ in procs})
            threading.Thread(target=observer.run, args=(stop,), daemon=True).start()
        # A watchdog: a user stuck past the deadline shows where (its Python stack, vlaked's log).
        def watchdog():
            if stop.wait(args.deadline):
                return
            print("notebooks: users still running after %d s; their stacks and vlaked's log:" % args.deadline,
                  file=sys.stderr, flush=True)
            for q, _ in procs:
                if q.poll() is None:
                    q.send_signal(__import__("signal").SIGUSR1)
            time.sleep(2)
            for j in range(len(procs)):
                with open(os.path.join(d, "user%d.err" % j)) as f:
                    print("--- user %d:\n%s" % (j, "".join(f.readlines()[-30:])), file=sys.stderr, flush=True)
            with open(os.path.join(d, "vlaked.log")) as f:
                print("--- vlaked:\n" + "".join(f.readlines()[-60:]), file=sys.stderr, flush=True)
            for q, _ in procs:
                if q.poll() is None:
                    q.kill()
        threading.Thread(target=watchdog, daemon=True).start()
        for i, (p, err) in enumerate(procs):
            lines = [json.loads(x) for x in p.stdout if x.startswith("{")]
            p.wait()
            err.close()
            done = [x for x in lines if x.get("event") == "done"]
            if not done:
                with open(os.path.join(d, "vlaked.log")) as f:
                    keep = ("failed", "lost", "is on the host", "back on GPU", "stays on", "swapping out", "error")
                    tail = "".join([x for x in f.readlines() if any(k in x for k in keep)][-40:])
                with open(err.name) as f:
                    raise RuntimeError("user %d failed (exit %s):\n%s\nvlaked's log:\n%s" % (
                        i, p.returncode, f.read()[-2000:], tail))
            outs[i] = done[0]
            if any(not b["ok"] for b in done[0]["bursts"]):
                with open(err.name) as f:
                    outs[i]["stderr"] = [x for x in f.read().splitlines()
                                         if "vlake" in x and "asked for memory" not in x][-4:]
        wall = time.monotonic() - t0
        seen = None
        if observer is not None:
            stop.set()
            time.sleep(0.5)  # the observer's last sample
            counters = ctl_json(args.vlakectl, daemon.state, "pool")["counters"]
            seen = dict(observer.figures(), swap_outs=counters["swap_outs"], swap_ins=counters["swap_ins"],
                        swap_failures=counters["swap_failures"], refusals=counters["refusals_recorded"])
    finally:
        stop.set()
        for p, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        daemon.stop()
    with open(os.path.join(d, "vlaked.log")) as f:
        log = f.read().splitlines()
    user_lines = []
    for i in range(args.users):
        with open(os.path.join(d, "user%d.err" % i)) as f:
            user_lines += f.read().splitlines()
    refusals = [x for x in log if " refused" in x or "waited" in x or "no memory" in x or "error" in x]
    bursts = [b for o in outs.values() for b in o["bursts"]]
    ok = [b for b in bursts if b["ok"]]
    ms = sorted(b["ms"] for b in ok)
    return {"reclaim": reclaim, "users": args.users, "factor": args.factor, "limit_bytes": limit,
            "bursts": len(bursts), "completed": len(ok), "oom": len(bursts) - len(ok),
            "reclaims": sum(o["reclaims"] for o in outs.values()),
            "burst_ms_p50": quantile(ms, 0.50), "burst_ms_p99": quantile(ms, 0.99),
            "burst_ms_max": ms[-1] if ms else None,
            "nvml_peak_used_bytes": peak[0], "wall_s": wall,
            "oom_ms": [round(b["ms"]) for b in bursts if not b["ok"]], "refusal_log": refusals[-8:],
            "oom_errors": [b.get("error", "") for b in bursts if not b["ok"]][-4:],
            "oom_stderr": [x for o in outs.values() for x in o.get("stderr", [])][-8:],
            "sums": {"%d/%d" % (i, b["round"]): b["sum"] for i, o in outs.items() for b in o["bursts"] if b["ok"]},
            "ms": {"%d/%d" % (i, b["round"]): b["ms"] for i, o in outs.items() for b in o["bursts"] if b["ok"]},
            "swap": swap_figures(log, user_lines) if overcommit and not tier else None,
            "tier": dict(tier_figures(log, user_lines), stock=stock) if tier else None, "vlakectl": seen}


def observed_problems(run, sw, tr=None):
    """What --vlakectl saw that contradicts NVML or vlaked's log (none without --vlakectl)."""
    v = run.get("vlakectl")
    if not v:
        return []
    problems = []
    if v["samples"] < 4 or v["errors"]:
        problems.append("vlakectl: %d samples, errors %s" % (v["samples"], v["errors"]))
    if v["host_but_listed"]:
        problems.append("vlakectl showed processes on the host that NVML listed: %s" % v["host_but_listed"])
    if v["gpu_listed"] == 0:
        problems.append("vlakectl never showed a process on the GPU that NVML listed")
    if v["idle_max_s"] < 0.5:
        problems.append("vlakectl's idle times stayed under 0.5 s (%.2f s); the users idle 0.5-3 s" % v["idle_max_s"])
    if sw is not None:
        if v["swap_outs"] != sw["swap_outs"] or v["swap_ins"] != sw["swap_ins"]:
            problems.append("vlakectl counted %d swap-outs and %d swap-ins, vlaked's log %d and %d" % (
                v["swap_outs"], v["swap_ins"], sw["swap_outs"], sw["swap_ins"]))
        if sw["swap_outs"] > 0 and v["host_seen"] == 0:
            problems.append("vlaked swapped processes out but vlakectl never showed one on the host")
        if v["waits_seen"] > 0 and v["waits_for_swapping"] == 0 and sw["swap_outs"] > 0:
            problems.append("no wait named a process being swapped out for it")
    if tr is not None and tr["demotes"]["count"] > 0 and v["tier_seen"] == 0:
        problems.append("vlaked moved memory to the host tier but vlakectl never showed a process with host bytes")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vlaked", required=True)
    ap.add_argument("--hook", required=True)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--factor", type=float)
    ap.add_argument("--overcommit", action="store_true")
    ap.add_argument("--host-tier", metavar="SIZE", help="vlaked's --host-tier (implies --overcommit)")
    ap.add_argument("--state-tool", help="vlake_state_json: with --host-tier, start once the stock is made")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--deadline", type=int, default=600, help="seconds before a run's stuck users are reported")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--keep", metavar="DIR", help="run in DIR and keep vlaked's and the users' logs there")
    ap.add_argument("--vlakectl", help="check vlakectl's processes and waits against NVML while the users run")
    args = ap.parse_args()
    if args.host_tier:
        args.overcommit = True
    if args.factor is None:
        args.factor = 2.0 if args.overcommit else 1.3
    rc = torch_gpu_as_root("notebooks")
    if rc is not None:
        return rc
    sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
    from nvml import Nvml
    total = Nvml(0).memory()["total"]
    work = args.keep if args.keep else tempfile.mkdtemp(prefix="vlake-notebooks-")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o755)
    try:
        if args.overcommit:
            runs = [run_alone(args, work, total),
                    run_mode(args, work, total, "tier" if args.host_tier else "overcommit")]
        else:
            runs = [run_mode(args, work, total, m) for m in ("off", "on")]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    off, on = runs
    same = [k for k in on["sums"] if k in off["sums"]]
    mismatched = [k for k in same if on["sums"][k] != off["sums"][k]]
    print("%d users, limits %.1f GiB each = %.2fx the GPU (%.1f GiB)" % (
        args.users, on["limit_bytes"] / GiB, args.users * on["limit_bytes"] / total, total / GiB))
    print("%-10s %7s %9s %5s %8s %12s %12s %12s %14s" % ("run", "bursts", "completed", "OOM", "reclaims",
                                                         "burst p50", "burst p99", "burst max", "NVML peak"))
    for r in runs:
        f = lambda v: "-" if v is None else "%.0f ms" % v
        if r["reclaim"] == "alone":
            print("%-10s %7d %9d %5d %8s %12s %12s %12s %14s   (%.0f s, one user at a time, no vlake)" % (
                "alone", r["bursts"], r["completed"], r["oom"], "-", "-", "-", "-", "-", r["wall_s"]))
            continue
        print("%-10s %7d %9d %5d %8d %12s %12s %12s %10.1f GiB" % (
            r["reclaim"], r["bursts"], r["completed"], r["oom"], r["reclaims"], f(r["burst_ms_p50"]),
            f(r["burst_ms_p99"]), f(r["burst_ms_max"]), r["nvml_peak_used_bytes"] / GiB))
    print("outputs: %d bursts completed in both runs, %d differ" % (len(same), len(mismatched)))
    sw = on.get("swap")
    if sw:
        g = lambda v, unit: "-" if v is None else ("%.0f %s" % (v, unit) if unit == "ms" else "%.2f %s" % (v, unit))
        print("swap: %d swap-outs (%.1f GiB), %d swap-ins, %d failures, %d restores that found no room in time" % (
            sw["swap_outs"], sw["swapped_gib"], sw["swap_ins"], sw["swap_failures"], sw["stayed_on_host"]))
        print("      a burst's wait for its restore: p50 %s, p99 %s, max %s (%d waits); checkpoint %s, restore %s" % (
            g(sw["restore_wait_ms_p50"], "ms"), g(sw["restore_wait_ms_p99"], "ms"), g(sw["restore_wait_ms_max"], "ms"),
            sw["restore_waits"], g(sw["checkpoint_s_per_gib"], "s/GiB"), g(sw["restore_s_per_gib"], "s/GiB")))
    tr = on.get("tier")
    if tr:
        g = lambda v, fmt: "-" if v is None else fmt % v
        print("host tier: %d demotes (%.1f GiB, %s), %d promotes (%.1f GiB, %s), %d failed moves, %d checkpoints" % (
            tr["demotes"]["count"], tr["demotes"]["gib"], g(tr["demotes"]["s_per_gib"], "%.3f s/GiB"),
            tr["promotes"]["count"], tr["promotes"]["gib"], g(tr["promotes"]["s_per_gib"], "%.3f s/GiB"),
            tr["failed"], tr["checkpoints"]))
        print("           a user's threads held for a move: p50 %s, p99 %s, max %s (%d moves)" % (
            g(tr["hold_ms_p50"], "%d ms"), g(tr["hold_ms_p99"], "%d ms"), g(tr["hold_ms_max"], "%d ms"), tr["holds"]))
        slow = sorted(on["ms"][k] / off["ms"][k] for k in on["ms"] if k in off["ms"] and off["ms"][k] > 0)
        extra = sorted(on["ms"][k] - off["ms"][k] for k in on["ms"] if k in off["ms"])
        va = tr["burst_vs_alone"] = {"ratio_p50": quantile(slow, 0.5), "ratio_p99": quantile(slow, 0.99),
                                     "extra_ms_p50": quantile(extra, 0.5), "extra_ms_p99": quantile(extra, 0.99)}
        print("           a burst against the same burst alone: %s / %s times (p50/p99), %s / %s longer" % (
            g(va["ratio_p50"], "%.2f"), g(va["ratio_p99"], "%.2f"), g(va["extra_ms_p50"], "%.0f ms"),
            g(va["extra_ms_p99"], "%.0f ms")))
    for r in runs:
        v = r.get("vlakectl")
        if v:
            print("vlakectl (%s, %d samples): on the host %d times, NVML listed %d of them; on the GPU and listed %d; "
                  "%d waits seen (at most %d at once), %d naming a process being swapped out for them; idle up to "
                  "%.1f s; on the host tier %d times (at most %.1f GiB); counters: %d swap-outs, %d swap-ins, "
                  "%d failures, %d refusals%s" % (
                      r["reclaim"], v["samples"], v["host_seen"], len(v["host_but_listed"]), v["gpu_listed"],
                      v["waits_seen"], v["max_waiting"], v["waits_for_swapping"], v["idle_max_s"], v["tier_seen"],
                      v["tier_max_bytes"] / GiB, v["swap_outs"],
                      v["swap_ins"], v["swap_failures"], v["refusals"],
                      "; errors: %s" % v["errors"] if v["errors"] else ""))
    for r in runs:
        if r["oom"]:
            print("reclaim %s: the OOM bursts ended after %s ms; vlaked's last refusals:" % (r["reclaim"], r["oom_ms"]))
            for line in r["refusal_log"]:
                print("  " + line[-300:])
            for e in r["oom_errors"]:
                print("  PyTorch: " + e)
            print("  the users' own lines:")
            for line in r["oom_stderr"]:
                print("  " + line[-300:])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"runs": runs, "compared": len(same), "mismatched": mismatched}, fh)
    if args.check and tr:
        problems = []
        if on["oom"] != 0 or on["completed"] != on["bursts"]:
            problems.append("host tier: %d of %d bursts done, %d OOM" % (on["completed"], on["bursts"], on["oom"]))
        if mismatched or len(same) != on["bursts"]:
            problems.append("outputs differ from the run alone: %d compared, %s" % (len(same), mismatched[:5]))
        if tr["demotes"]["count"] == 0:
            problems.append("nothing was demoted: the workload does not need the host tier")
        if tr["failed"]:
            problems.append("%d host tier moves failed or got no answer" % tr["failed"])
        if tr["checkpoints"]:
            problems.append("%d processes were checkpointed: the tier should have moved them" % tr["checkpoints"])
        if tr["hold_ms_p99"] is not None and tr["hold_ms_p99"] > 2000:
            problems.append("a move held a user's threads %d ms at p99 (at most 2000 ms)" % tr["hold_ms_p99"])
        for name in ("demotes", "promotes"):
            spg = tr[name]["s_per_gib"]
            if spg is not None and spg > 0.05:
                problems.append("%s took %.3f s/GiB end to end (at most 0.05)" % (name, spg))
        problems += observed_problems(on, None, tr)
        for p in problems:
            print("FAIL " + p)
        print("notebooks: %s" % ("PASS" if not problems else "FAIL"))
        return 1 if problems else 0
    if args.check and args.overcommit:
        problems = []
        if on["oom"] != 0 or on["completed"] != on["bursts"]:
            problems.append("overcommit: %d of %d bursts done, %d OOM" % (on["completed"], on["bursts"], on["oom"]))
        if mismatched or len(same) != on["bursts"]:
            problems.append("outputs differ from the run alone: %d compared, %s" % (len(same), mismatched[:5]))
        if not sw or sw["swap_outs"] == 0:
            problems.append("nobody was swapped out: the workload does not need overcommit")
        if sw and sw["swap_failures"]:
            problems.append("%d checkpoints or restores failed" % sw["swap_failures"])
        problems += observed_problems(on, sw)
        for p in problems:
            print("FAIL " + p)
        print("notebooks: %s" % ("PASS" if not problems else "FAIL"))
        return 1 if problems else 0
    if args.check:
        problems = observed_problems(on, None)
        if on["oom"] != 0:
            problems.append("reclaim on: %d bursts hit out of memory" % on["oom"])
        if mismatched:
            problems.append("outputs differ: %s" % mismatched[:5])
        if off["oom"] == 0:
            problems.append("reclaim off had no OOM: the workload does not need the idle notebooks' memory")
        for p in problems:
            print("FAIL " + p)
        print("notebooks: %s" % ("PASS" if not problems else "FAIL"))
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
