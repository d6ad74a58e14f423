#!/usr/bin/env python3
"""CUDA contexts count against a tenant's limit (docs/quota.md, "Contexts"), on the real driver.

A CUDA context takes device memory (~518 MiB on the H100) before any allocation. A tenant with a
2 GiB limit starts 10 processes (vlake_hook_tenant under the hook, each creating its primary
context and then holding it): vlaked must admit a context's memory before the driver creates it,
so
  1. the tenant's processes hold at most 2 GiB + one context on the GPU, read from NVML by this
     script (libnvidia-ml directly, and nvidia-smi --query-compute-apps where present): nothing
     of vlake's figures is used;
  2. the processes that did not fit get CUDA_ERROR_OUT_OF_MEMORY (2) from the call that would
     create the context, and print vlake's out-of-memory line ("a CUDA context of ... refused");
  3. at least one process was served (the limit holds a context).
--how picks the context each process creates: its primary context (`primary`, the default: what
the runtime does), one of its own with cuCtxCreate_v2 (`create`) or a green context of all SMs
(`green`, cuGreenCtxCreate); the per-process NVML figures are printed either way.
Exit 0 only if every check passed, 77 = skipped (no GPU / NVML, not root: the tenant runs as its
own uid). --sim runs the same against the simulator (VLAKE_SIM_CONTEXT_MEMORY=518MiB).

  contexts.py --vlaked PATH --tenant PATH --hook PATH [--driver LIB] [--nvml LIB] [--sim] [--keep]
              [--how primary|create|green]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checks import Checks, testprocs  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
SKIP = 77
UID = 2301  # the tenant
LIMIT = 2 * GiB
PROCESSES = 10
OUT_OF_MEMORY = 2

check = Checks()


def nvidia_smi_pids():
    """pid -> used bytes from nvidia-smi --query-compute-apps (None when it is not there)."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return None
    pids = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            pids[int(parts[0])] = pids.get(int(parts[0]), 0) + int(parts[1]) * MiB
    return pids


def main():
    ap = argparse.ArgumentParser()
    for a in ("--vlaked", "--tenant", "--hook"):
        ap.add_argument(a, required=True)
    ap.add_argument("--driver", default="libcuda.so.1")
    ap.add_argument("--nvml", default="libnvidia-ml.so.1")
    ap.add_argument("--sim", action="store_true", help="the driver and NVML are the simulator's")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--how", choices=("primary", "create", "green"), default="primary")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (the tenant runs under its own uid)")
        return SKIP

    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if args.sim:
        os.umask(0o002)
        env.update(VLAKE_SIM_NODE="contexts-%d" % os.getpid(), VLAKE_SIM_DEVICE_MEMORY="16GiB",
                   VLAKE_SIM_CONTEXT_MEMORY="518MiB", LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.driver)))
        os.environ.update(VLAKE_SIM_NODE=env["VLAKE_SIM_NODE"], VLAKE_SIM_DEVICE_MEMORY="16GiB")
    try:
        from nvml import Nvml
        nv = Nvml(library=args.nvml)
    except Exception as e:  # no GPU, no NVML
        print("SKIP: no GPU here (%s)" % e)
        return SKIP

    work = tempfile.mkdtemp(prefix="vlake-contexts-")
    os.chmod(work, 0o755)
    sock = os.path.join(work, "vlaked.sock")
    state = "vlake-contexts-%d" % os.getpid()
    cfg = os.path.join(work, "vlake.yaml")
    with open(cfg, "w") as f:
        f.write("version: 1\ndefault: {limit: 1GiB}\nusers:\n  - {uid: %d, limit: 2GiB}\n" % UID)
    log_path = os.path.join(work, "vlaked.log")
    log = open(log_path, "w")
    daemon = subprocess.Popen([args.vlaked, "--config", cfg, "--socket", sock, "--state", state, "--driver",
                               args.driver, "--nvml", args.nvml, "--sample-interval-ms", "200",
                               "--metrics-address", "none"], stdout=log, stderr=subprocess.STDOUT, env=env)
    tenants = []
    try:
        deadline = time.time() + 60
        while not os.path.exists(sock):
            if daemon.poll() is not None or time.time() > deadline:
                raise RuntimeError("vlaked did not start; see " + log_path)
            time.sleep(0.1)
        os.chmod(os.path.dirname(sock), 0o755)
        os.chmod(sock, 0o666)

        # A sanitizer build's hook comes before the sanitizer runtime in the tenant's load order.
        asan_options = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
        tenv = dict(env, LD_PRELOAD=os.path.abspath(args.hook), VLAKE_SOCKET=sock, VLAKE_RESERVE="0",
                    ASAN_OPTIONS=asan_options)

        # On the simulator the tenant keeps gid 0: the simulated GPU is a group-writable file of root's.
        gid = 0 if args.sim else UID

        def as_tenant():
            os.setgid(gid)
            os.setuid(UID)

        steps = {"primary": ["init"], "create": ["init-only", "ctxcreate:c"],
                 "green": ["init-only", "greenctx:g"]}[args.how]
        for i in range(PROCESSES):
            err = open(os.path.join(work, "tenant-%d.err" % i), "w+")
            p = subprocess.Popen([args.tenant] + steps + ["sleep:120000"], stdout=subprocess.PIPE, stderr=err,
                                 text=True, env=tenv, preexec_fn=as_tenant)
            tenants.append((p, err))
        rcs = []
        for p, _ in tenants:
            # "resolve rc=0 ...", then "<step> rc=N" for each step: the last step's rc, or None
            # when an earlier step failed (neither served nor refused) or the process ended.
            rc, pending = None, list(steps)
            for line in p.stdout:
                if not pending or not line.startswith(pending[0] + " rc="):
                    continue
                got = int(line.split("rc=")[1].split()[0])
                pending.pop(0)
                if not pending:
                    rc = got
                if got != 0 or not pending:
                    break
            rcs.append(rc)
        served = [p.pid for (p, _), rc in zip(tenants, rcs) if rc == 0]
        refused = [i for i, rc in enumerate(rcs) if rc == OUT_OF_MEMORY]
        print("init results: %s" % rcs, flush=True)
        time.sleep(2)  # every context settled

        procs = nv.processes()
        pids = {p.pid for p, _ in tenants}
        print("NVML per process (MiB, %s contexts): %s" % (args.how, ", ".join(
            "%d: %.1f" % (pid, procs[pid] / MiB) for pid in sorted(procs) if pid in pids)), flush=True)
        held = sum(b for pid, b in procs.items() if pid in pids)
        contexts = [procs[pid] for pid in served if pid in procs]
        one = max(contexts) if contexts else 0
        check("a tenant with a 2 GiB limit starting 10 processes (%s contexts) holds at most 2 GiB + one context (NVML)"
              % args.how,
              held <= LIMIT + one,
              "NVML: the tenant's %d listed processes hold %.1f MiB; one context %.1f MiB; limit %.0f MiB"
              % (len([p for p in procs if p in pids]), held / MiB, one / MiB, LIMIT / MiB))
        smi = nvidia_smi_pids() if not args.sim else None
        if smi is not None:
            held_smi = sum(b for pid, b in smi.items() if pid in pids)
            check("nvidia-smi --query-compute-apps agrees: at most 2 GiB + one context", held_smi <= LIMIT + one,
                  "nvidia-smi: %.1f MiB" % (held_smi / MiB))
        check("at least one process was served (the limit holds a context)", len(served) >= 1,
              "%d served" % len(served))
        check("every other process got CUDA_ERROR_OUT_OF_MEMORY from its context's creation",
              len(served) + len(refused) == PROCESSES and len(refused) >= 1,
              "%d served, %d refused, results %s" % (len(served), len(refused), rcs))
        lines = 0
        for i in refused:
            err = tenants[i][1]
            err.flush()
            err.seek(0)
            text = err.read()
            if "vlake: out of memory on GPU 0: tenant" in text and "a CUDA context of" in text:
                lines += 1
            else:
                print("tenant %d stderr: %s" % (i, text.strip()[-500:]))
        check("each refused process printed vlake's out-of-memory line", refused and lines == len(refused),
              "%d of %d" % (lines, len(refused)))
    finally:
        for p, err in tenants:
            testprocs.stop(p)
            err.close()
        testprocs.stop(daemon)
        log.close()
        testprocs.unlink_quiet("/dev/shm/" + state)
        if args.sim:
            testprocs.unlink_quiet("/dev/shm/vlake-sim-" + env["VLAKE_SIM_NODE"])
        if args.keep:
            print("kept " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return check.table()


if __name__ == "__main__":
    sys.exit(main())
