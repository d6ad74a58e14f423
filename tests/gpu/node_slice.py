#!/usr/bin/env python3
"""GPU acceptance test of the node slice: a real vlaked over the real driver, PyTorch tenants
under libvlake-hook.so.

Checks, printing a table at the end (exit 0 only if every check passed; 77 = skipped):
  1. a small transformer trains for 60 steps under the hook with the default allocator and
     with expandable segments, with losses equal to a run without the hook (same seed);
  2. torch.cuda.mem_get_info() and nvidia-smi under the hook report the tenant's limit;
  3. an allocation beyond the limit raises torch.OutOfMemoryError and the process goes on;
  4. two tenants (two uids) train at the same time;
  5. accounting reconciles with NVML while 4 tenants hold memory, one of them without the hook:
     per GPU, the tenants' usage as the daemon accounts it (pool grants, their processes' own
     memory, memory outside vlake, retained memory) + the daemon's free pool + the daemon's own
     context (its NVML figure minus its pool, measured after the tenants left) equals NVML's
     used memory (nvmlDeviceGetMemoryInfo_v2, which keeps the driver's reserve apart) within
     64 MiB. Granted bytes appear on one side only, so wrong grant accounting fails it.

  node_slice.py --vlaked PATH --hook PATH --state-tool PATH [--keep]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checks import GiB, MiB, SKIP, Checks, testprocs  # noqa: E402
OTHER_UID = 1001
THIRD_UID = 1002
UNHOOKED_UID = 1003

check = Checks()


def gpu_present():
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                             capture_output=True, text=True, timeout=120)
        return out.stdout.strip() == "True"
    except Exception:
        return False


def run_json(cmd, env, user=None, timeout=600, stdin=None):
    kw = {}
    if user is not None:
        kw = {"user": user, "group": user, "extra_groups": []}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, input=stdin, **kw)
    last = [l for l in p.stdout.splitlines() if l.startswith("{")]
    data = json.loads(last[-1]) if last else None
    return p.returncode, data, p.stderr


class Daemon:
    """vlaked with `config` as its quota file in `workdir`; stop() ends it and removes its state."""

    def __init__(self, vlaked, workdir, config, extra_args=(), env=None):
        self.sock = os.path.join(workdir, "vlaked.sock")
        self.state = "vlake-gpu-check-%d" % os.getpid()
        cfg = os.path.join(workdir, "vlake.yaml")
        with open(cfg, "w") as f:
            f.write(config)
        self.log = open(os.path.join(workdir, "vlaked.log"), "w")
        import socket as _socket
        with _socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.metrics = "127.0.0.1:%d" % s.getsockname()[1]
        self.proc = subprocess.Popen([vlaked, "--config", cfg, "--socket", self.sock, "--state", self.state,
                                      "--log-level", "info", "--metrics-address", self.metrics, *extra_args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("vlaked did not start; see " + self.log.name)
            time.sleep(0.1)

    def stop(self):
        testprocs.stop(self.proc)
        self.log.close()
        testprocs.unlink_quiet(testprocs.state_path(self.state))


def clean_up(check, daemon, work, keep=False):
    """The end of a script around one daemon (a Daemon, or one with the same stop() and log):
    stops it (printing its log's tail when a check failed) and removes the work directory
    unless `keep`."""
    if daemon is not None:
        daemon.stop()
        if check.any_failed():
            with open(daemon.log.name) as f:
                print("---- vlaked log (tail) ----\n" + "".join(f.readlines()[-40:]))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def state_json(tool, state):
    out = subprocess.run([tool, "--state", state, "--json"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError("state tool failed: " + out.stderr)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vlaked", required=True)
    ap.add_argument("--hook", required=True)
    ap.add_argument("--state-tool", required=True)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    if not shutil.which("nvidia-smi") or not gpu_present():
        print("SKIP: no GPU with PyTorch here")
        return SKIP

    from nvml import Nvml
    nv = Nvml()
    total = nv.memory()["total"]
    root_limit = 24 * GiB
    other_limit = 8 * GiB

    work = tempfile.mkdtemp(prefix="vlake-gpu-")
    os.chmod(work, 0o755)
    home = os.path.join(work, "home-%d" % OTHER_UID)
    os.makedirs(home)
    os.chown(home, OTHER_UID, OTHER_UID)
    base = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")

    # 1. reference run, no hook
    rc, ref, err = run_json([sys.executable, os.path.join(HERE, "train.py"), "--steps", "60"], base)
    if not check("reference training without the hook", rc == 0 and ref, err[-300:] if rc else ""):
        return 1

    config = ("version: 1\ndefault:\n  limit: %dGiB\nusers:\n  - uid: %d\n    limit: %dGiB\n"
              % (root_limit // GiB, OTHER_UID, other_limit // GiB))
    daemon = Daemon(args.vlaked, work, config)
    hooked = dict(base, LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock)
    # The second tenant's uid has no passwd entry: give Python what getpass needs.
    other_env = dict(hooked, HOME=home, USER="tenant%d" % OTHER_UID, LOGNAME="tenant%d" % OTHER_UID)
    try:
        # 1. training under the hook, both allocators
        for name, extra in (("default allocator", {}),
                            ("expandable segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})):
            rc, got, err = run_json([sys.executable, os.path.join(HERE, "train.py"), "--steps", "60"],
                                    dict(hooked, **extra))
            ok = rc == 0 and got is not None
            same = ok and got["losses"] == ref["losses"]
            diff = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"])) if ok else None
            check("train 60 steps under the hook (%s): losses equal" % name, same,
                  "rc=%d max|diff|=%s first=%s last=%s" % (rc, diff, got and got["losses"][0],
                                                         got and got["losses"][-1]) if ok else err[-400:])
            if ok:
                check("mem_get_info under the hook shows the limit (%s)" % name,
                      got["mem_get_info"][1] == root_limit,
                      "total=%d limit=%d" % (got["mem_get_info"][1], root_limit))

        # 2. nvidia-smi under the hook
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"],
                             env=hooked, capture_output=True, text=True, timeout=60)
        shown = smi.stdout.strip().split(",")
        check("nvidia-smi under the hook shows the limit",
              smi.returncode == 0 and int(shown[0]) == root_limit // MiB, "nvidia-smi: " + smi.stdout.strip())

        # 3. over the limit, as the other tenant
        rc, got, err = run_json([sys.executable, os.path.join(HERE, "oom.py"), str(other_limit)],
                                other_env, user=OTHER_UID)
        check("allocation beyond the limit raises torch.OutOfMemoryError",
              rc == 0 and got and got["error"] == "OutOfMemoryError" and got["after"] == 64 << 20,
              (json.dumps(got)[:300] if got else err[-300:]))
        vl = [l for l in err.splitlines() if l.startswith("vlake:")]
        check("the refusal names tenant and limit on stderr", vl and "limit" in vl[0], vl[0] if vl else err[-200:])
        if got:
            check("mem_get_info of the second tenant shows its limit", got["mem_get_info"][1] == other_limit,
                  str(got["mem_get_info"]))

        # 4. two tenants training at once
        procs = []
        for user, env in ((None, hooked), (OTHER_UID, other_env)):
            kw = {"user": user, "group": user, "extra_groups": []} if user else {}
            procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"), "--steps", "60"],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw))
        outs = [p.communicate(timeout=600) for p in procs]
        both = all(p.returncode == 0 for p in procs)
        same = both and all(json.loads(o[0].splitlines()[-1])["losses"] == ref["losses"] for o in outs)
        check("two tenants train at once, losses equal the reference", same,
              "; ".join("rc=%d %s" % (p.returncode, o[1][-200:]) for p, o in zip(procs, outs) if p.returncode))

        # 5. accounting reconciliation while 4 tenants hold memory, the last one without the hook
        holders = []
        for uid in (THIRD_UID, UNHOOKED_UID):
            h = os.path.join(work, "home-%d" % uid)
            os.makedirs(h, exist_ok=True)
            os.chown(h, uid, uid)
        third_env = dict(hooked, HOME=os.path.join(work, "home-%d" % THIRD_UID), USER="tenant%d" % THIRD_UID)
        unhooked_env = dict(base, HOME=os.path.join(work, "home-%d" % UNHOOKED_UID), USER="tenant%d" % UNHOOKED_UID)
        for user, mib, env in ((None, 3000, hooked), (OTHER_UID, 2000, other_env), (THIRD_UID, 1500, third_env),
                               (UNHOOKED_UID, 1000, unhooked_env)):
            kw = {"user": user, "group": user, "extra_groups": []} if user else {}
            p = subprocess.Popen([sys.executable, os.path.join(HERE, "hold.py"), str(mib)], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
            line = p.stdout.readline()
            holders.append((p, json.loads(line)))
        time.sleep(3)  # several NVML sampling intervals of the daemon
        st = state_json(args.state_tool, daemon.state)
        mem = nv.memory()
        unhooked = [t for t in st["tenants"] if t["name"].endswith("uid:%d" % UNHOOKED_UID)]
        check("the process without the hook is attributed to its tenant",
              unhooked and unhooked[0]["unhooked"][0] >= 1000 * MiB,
              "tenant uid:%d: %s" % (UNHOOKED_UID, unhooked[0] if unhooked else "absent"))
        # The exporter's per-tenant series agree with the daemon's state.
        import urllib.request
        text = urllib.request.urlopen("http://%s/metrics" % daemon.metrics, timeout=10).read().decode()
        scraped = {}
        for line in text.splitlines():
            if line.startswith("vlake_tenant_used_bytes{"):
                labels, value = line[len("vlake_tenant_used_bytes{"):].rsplit("} ", 1)
                tenant = [kv.split("=", 1)[1].strip('"') for kv in labels.split(",") if kv.startswith("tenant=")][0]
                scraped[tenant] = float(value)
        st2 = state_json(args.state_tool, daemon.state)
        want = {t["name"]: t["used"][0] for t in st2["tenants"]}
        check("Prometheus series vlake_tenant_used_bytes match the daemon's accounting",
              scraped and all(abs(scraped.get(k, -1) - v) <= 64 * MiB for k, v in want.items()),
              "scraped %s; state %s" % ({k: int(v) // MiB for k, v in scraped.items()},
                                         {k: v // MiB for k, v in want.items()}))
        for p, info in holders:
            p.stdin.close()
            p.wait(timeout=60)
        # The daemon's own context, once the tenants are gone (it is created lazily: not there at
        # start): its NVML figure less the pool it still holds, from another sample than the one
        # checked, so no term is derived from another.
        time.sleep(3)
        idle = state_json(args.state_tool, daemon.state)["devices"][0]
        daemon_context = nv.processes().get(daemon.proc.pid, 0) - idle["pool_bytes"]
        check.reconcile("accounting reconciles with NVML within 64 MiB (4 tenants, one unhooked)", st, mem["used"],
                        daemon_context, " (reserve %.1f apart)" % (mem["reserved"] / MiB))
        print("tenants:", json.dumps(st["tenants"])[:2000])
    finally:
        clean_up(check, daemon, work, args.keep)

    return check.table(70)


if __name__ == "__main__":
    sys.exit(main())
