#!/usr/bin/env python3
"""Writes into shared read-only memory and kernel faults, reported as what they are
(docs/guard.md, "What is reported, as what"), with a real vlaked. Runs on the real driver (label
gpu) or on the simulator (--sim, label sim): vlake_hook_tenant processes under libvlake-hook.so,
as the calling user, guard mode off.

Checks (a table at the end; exit 0 only if every check passed, 77 = skipped):
  1. after vlake_share_readonly of a 20 MiB allocation (chunks [2 MiB, 18 MiB) shared), a
     cuMemsetD8, a cuMemcpyDtoD and a cuMemsetD32Async into shared chunks are refused with
     CUDA_ERROR_INVALID_VALUE (1); the context keeps working and the data is unchanged;
  2. each is one `readonly_write` event naming the call, its destination, size, the allocation
     and the first shared offset it hit; counted as guard_readonly_writes;
  3. a kernel write into a shared chunk gives CUDA_ERROR_ILLEGAL_ADDRESS (700) and one kernel
     fault event with maps_shared=true, guarded=false; no guard violation;
  4. a kernel write 1 GiB past a private allocation (another process, no shared chunks): a
     kernel fault with maps_shared=false;
  5. counters: guard_readonly_writes 3, kernel_faults 2, kernel_faults_shared 1.

  readonly_write.py --vlaked PATH --hook PATH --tenant PATH --vlakectl PATH
                    [--driver LIB] [--nvml LIB] [--sim]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checks import Checks  # noqa: E402
import node_slice as ns  # noqa: E402
MiB = 1 << 20
SKIP = 77

check = Checks()


def steps_out(stdout):
    """{step: {key: value}} of the tenant's output lines ("<step> rc=<n> key=value ...")."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if not parts:
            continue
        out[parts[0]] = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    return out


def main():
    ap = argparse.ArgumentParser()
    for a in ("--vlaked", "--hook", "--tenant", "--vlakectl"):
        ap.add_argument(a, required=True)
    ap.add_argument("--driver", default="libcuda.so.1")
    ap.add_argument("--nvml", default="libnvidia-ml.so.1")
    ap.add_argument("--sim", action="store_true", help="the driver and NVML are the simulator's")
    args = ap.parse_args()

    env = dict(os.environ)
    if args.sim:
        env.update(VLAKE_SIM_NODE="rowrite-%d" % os.getpid(), VLAKE_SIM_DEVICE_MEMORY="4GiB",
                   VLAKE_SIM_CONTEXT_MEMORY="8MiB", LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.driver)))
    elif shutil.which("nvidia-smi") is None or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        print("SKIP: no GPU here")
        return SKIP

    work = tempfile.mkdtemp(prefix="vlake-rowrite-")
    daemon = None
    try:
        daemon = ns.Daemon(args.vlaked, work, "version: 1\ndefault:\n  limit: 2GiB\n  guard: off\n",
                           ("--driver", args.driver, "--nvml", args.nvml, "--sample-interval-ms", "200"), env)
        sock, state = daemon.sock, daemon.state
        # Under ASan the tenant is instrumented and the preloaded hook comes before its runtime.
        asan_options = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
        hooked = dict(env, LD_PRELOAD=args.hook, VLAKE_SOCKET=sock, ASAN_OPTIONS=asan_options)
        writer = ["init", "alloc:w:20M", "alloc:src:1M", "upload:w:5:20M", "share:w:1M:18M",
                  "memset:w:4194304:16:1", "dtod:w:8388608:src:4096", "memset32async:w:12582912:16:7",
                  "streamsync", "verify:w:5:20M", "kfill:w:4194304:16", "sync"]
        a = subprocess.run([args.tenant] + writer, env=hooked, capture_output=True, text=True, timeout=300)
        b = subprocess.run([args.tenant, "init", "alloc:p:2M", "kfill:p:1073741824:1024", "sync"], env=hooked,
                           capture_output=True, text=True, timeout=300)
        sa, sb = steps_out(a.stdout), steps_out(b.stdout)
        print("writer:\n" + a.stdout + a.stderr + "\nprivate fault:\n" + b.stdout + b.stderr)
        rc = lambda s, k: s.get(k, {}).get("rc")  # noqa: E731
        check("share of the 20 MiB allocation", rc(sa, "share:w:1M:18M") == "0",
              str(sa.get("share:w:1M:18M")))
        for step in ("memset:w:4194304:16:1", "dtod:w:8388608:src:4096", "memset32async:w:12582912:16:7"):
            check("%s into shared chunks refused with 1" % step, rc(sa, step) == "1", str(sa.get(step)))
        check("the context keeps working after the refused writes", rc(sa, "streamsync") == "0")
        check("the shared data is unchanged", sa.get("verify:w:5:20M", {}).get("ok") == "1")
        check("a kernel write into a shared chunk faults (700)", rc(sa, "sync") == "700")
        check("a kernel write past a private allocation faults (700)", rc(sb, "sync") == "700")
        check("the hook logs the refused cuMemcpyDtoD", "cuMemcpyDtoD into shared read-only memory refused" in a.stderr)

        time.sleep(1)
        ev = json.loads(subprocess.run([args.vlakectl, "--state", state, "events", "--json"], capture_output=True,
                                       text=True, timeout=60).stdout)["events"]
        pool = json.loads(subprocess.run([args.vlakectl, "--state", state, "pool", "--json"], capture_output=True,
                                         text=True, timeout=60).stdout)
        print("vlakectl events --json:", json.dumps(ev)[:3000])
        ptr = int(sa.get("alloc:w:20M", {}).get("ptr", "0"), 16)
        writes = [e for e in ev if e["kind"] == "readonly_write"]
        want = [("cuMemsetD8", 4 * MiB, 16), ("cuMemcpyDtoD", 8 * MiB, 4096), ("cuMemsetD32Async", 12 * MiB, 64)]
        got = [(e["call"], e["address"] - ptr, e["requested_bytes"]) for e in writes]
        check("one readonly_write event per refused call: call, destination, size", got == want, str(got))
        check("each names the allocation and the first shared offset hit",
              len(writes) == 3 and all(e["suspects"] and e["suspects"][0]["address"] == ptr and
                                       e["suspects"][0]["bytes"] == 20 * MiB and
                                       e["first_bad_offset"] == w[1] for e, w in zip(writes, want)),
              json.dumps(writes)[:600])
        faults = [e for e in ev if e["kind"] == "fault"]
        shared = [e for e in faults if e.get("maps_shared")]
        private = [e for e in faults if not e.get("maps_shared")]
        check("the kernel write into shared memory: one kernel fault, maps_shared, not guarded",
              len(shared) == 1 and not shared[0]["guarded"] and shared[0]["cuda_status"] == 700, json.dumps(shared))
        check("the private overrun: one kernel fault without maps_shared", len(private) == 1, json.dumps(private))
        check("no event of another kind", len(ev) == 5, str([e["kind"] for e in ev]))
        c = pool.get("counters", {})
        check("counters: guard_readonly_writes 3, kernel_faults 2, kernel_faults_shared 1",
              c.get("guard_readonly_writes") == 3 and c.get("kernel_faults") == 2 and
              c.get("kernel_faults_shared") == 1 and c.get("guard_violations_canary") == 0, json.dumps(c))
    finally:
        ns.clean_up(check, daemon, work)
    return check.table()


if __name__ == "__main__":
    sys.exit(main())
