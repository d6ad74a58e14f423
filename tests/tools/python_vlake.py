#!/usr/bin/env python3
"""python/vlake without PyTorch, on the simulator (label sim):
  1. without the hook: available() is False and every call raises VlakeError (share_module and
     device_buffer before they import torch);
  2. under the hook with vlaked on the simulated driver, two processes each allocate 8 MiB with
     vlake's own allocation (_DeviceMemory: cuMemAlloc_v2 as the hook exports it, the path
     share_module packs weights into), fill it with the same bytes and share it: the allocation
     starts on a chunk boundary, the first process merges nothing, the second merges all 8 MiB,
     the daemon holds 8 MiB of shared chunks for 16 MiB of logical bytes; after both release
     their allocations (cuMemFree_v2 returns 0) no shared chunk is left.
Also compiles every Python file of python/, examples/ and tests/gpu/ (they run only on GPU
machines otherwise).

  python_vlake.py --vlaked PATH --hook PATH --driver PATH --nvml PATH --state-tool PATH
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

from sim_vlaked import TENANT_PROLOGUE, SimVlaked

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20

TENANT = "\nimport ctypes, json, sys\n" + TENANT_PROLOGUE + r"""n = 8 << 20
m = vlake._DeviceMemory(n, 0)
data = b"".join(bytes((j * 7 + c) % 256 for j in range(256)) * (n // 1024) for c in range(4))  # 4 distinct chunks
cuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
assert cuda.cuMemcpyHtoD_v2(m.ptr, data, n) == 0
cai = m.__cuda_array_interface__
r = vlake.share_readonly(m.ptr, n)
print(json.dumps(dict(r, aligned=m.ptr % vlake.chunk_bytes() == 0, cai_ptr=cai["data"][0] == m.ptr,
                      cai_shape=list(cai["shape"]))), flush=True)
sys.stdin.readline()
print(json.dumps({"free_rc": m.release()}), flush=True)
sys.stdin.readline()
"""

results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""), flush=True)


def state(tool, name):
    out = subprocess.run([tool, "--state", name, "--json"], capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)["devices"][0]


def main():
    ap = argparse.ArgumentParser()
    for a in ("--vlaked", "--hook", "--driver", "--nvml", "--state-tool"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()

    bad = []
    files = sorted(glob.glob(os.path.join(ROOT, "python", "**", "*.py"), recursive=True)
                   + glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True)
                   + glob.glob(os.path.join(ROOT, "tests", "gpu", "*.py")))
    for f in files:
        try:
            with open(f) as src:
                compile(src.read(), f, "exec")  # nothing written next to the sources
        except SyntaxError as e:
            bad.append("%s:%s: %s" % (f, e.lineno, e.msg))
    check("every Python file compiles", files and not bad, "%d files%s" % (len(files), "; " + "; ".join(bad) if bad else ""))

    sys.dont_write_bytecode = True  # nothing written into the source tree
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import vlake
    check("without the hook: available() is False", not vlake.available())
    for name, call in (("share_readonly", lambda: vlake.share_readonly(0, 1)),
                       ("chunk_bytes", vlake.chunk_bytes),
                       ("device_buffer", lambda: vlake.device_buffer(1)),
                       ("share_module", lambda: vlake.share_module(object()))):
        try:
            call()
            check("without the hook: %s raises VlakeError" % name, False, "it returned")
        except vlake.VlakeError as e:
            check("without the hook: %s raises VlakeError" % name, "not loaded" in str(e), str(e))

    failed = lambda: not all(results)
    with SimVlaked(args, "pytest", "version: 1\ndefault:\n  dedup_domain: test\n",
                   ("--sample-interval-ms", "200"), failed) as vd:
        return run_tenants(args, vd)


def run_tenants(args, vd):
    st = vd.state
    tenv = vd.tenant_env(args.hook, VLAKE_RESERVE="0")
    tenants = []
    try:
        replies = []
        for _ in range(2):  # one after the other: the second finds the first's chunks
            t = subprocess.Popen([sys.executable, "-B", "-c", TENANT, os.path.join(ROOT, "python")], env=tenv,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            tenants.append(t)
            line = t.stdout.readline()
            if not line:
                raise RuntimeError("tenant failed (exit %s)" % t.wait())
            replies.append(json.loads(line))
        a, b = replies
        check("the allocation starts on a chunk boundary, __cuda_array_interface__ describes it",
              a["aligned"] and b["aligned"] and a["cai_ptr"] and a["cai_shape"] == [8 * MiB], str(a))
        check("the first share merges nothing, the second all 8 MiB",
              a["shared_bytes"] == 8 * MiB and a["merged_bytes"] == 0 and b["merged_bytes"] == 8 * MiB
              and a["copied_bytes"] == 0 and b["copied_bytes"] == 0,
              "first %s, second %s" % (a, b))
        d = state(args.state_tool, st)
        check("vlaked holds the 8 MiB once for 16 MiB of logical bytes",
              d["dedup_physical_bytes"] == 8 * MiB and d["dedup_logical_bytes"] == 16 * MiB,
              "physical %d, logical %d" % (d["dedup_physical_bytes"], d["dedup_logical_bytes"]))
        rcs = []
        for t in tenants:
            t.stdin.write("\n")
            t.stdin.flush()
            rcs.append(json.loads(t.stdout.readline())["free_rc"])
        time.sleep(0.5)
        d = state(args.state_tool, st)
        check("release() frees both allocations and the shared chunks go",
              rcs == [0, 0] and d["dedup_physical_bytes"] == 0 and d["dedup_logical_bytes"] == 0,
              "cuMemFree_v2 %s, physical %d" % (rcs, d["dedup_physical_bytes"]))
    finally:
        for t in tenants:
            if t.poll() is None:
                try:
                    t.stdin.write("\n")
                    t.stdin.flush()
                except OSError:
                    pass
                try:
                    t.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    t.kill()
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
