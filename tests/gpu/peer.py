#!/usr/bin/env python3
"""Peer access to served memory between two real GPUs (docs/hook.md, "Several GPUs"), with a
real vlaked: one vlake_hook_tenant process under libvlake-hook.so, the steps of the simulator
test `e2e: served memory of GPU 1 is reachable from GPU 0 only after cuCtxEnablePeerAccess`.

Checks (a table at the end; exit 0 only if every check passed, 77 = fewer than 2 GPUs or no P2P):
  1. before cuCtxEnablePeerAccess, GPU 0 has no access to a served allocation of GPU 1
     (cuMemGetAccess 0) and a memset from GPU 0's context into it is refused;
  2. cuCtxEnablePeerAccess returns 0, a second call CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED (704);
  3. afterwards GPU 0 has read-write access to GPU 1's allocations: the one made before, one
     made after and one reused from the local reserve; GPU 0's memset and kernel writes into them
     are GPU 1's data (read back in GPU 1's context);
  4. cuCtxDisablePeerAccess returns 0, a second call CUDA_ERROR_PEER_ACCESS_NOT_ENABLED (705);
     the access is revoked (cuMemGetAccess 0; GPU 1 keeps its own) and a kernel write from GPU 0
     then faults (700); or, where the driver refuses the revocation, the hook says so and keeps
     the access (printed, not a failure: docs/hook.md).

  peer.py --vlaked PATH --hook PATH --tenant PATH
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checks import Checks  # noqa: E402
from readonly_write import steps_out  # noqa: E402
import node_slice as ns  # noqa: E402
SKIP = 77
READ_WRITE = "3"  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE

check = Checks()

STEPS = ["init", "ctx:1", "alloc:pre:4M", "alloc:r:6M", "free:r", "ctx:0",
         "memset:pre:0:4096:7#before", "access:pre:0#before",
         "peer:1", "peer:1#again",
         "memset:pre:0:4096:7#after", "access:pre:0#after", "access:pre:1#after",
         "ctx:1", "alloc:post:8M", "alloc:reused:6M", "fill:post:8M:3",
         "ctx:0", "memset:post:0:8M:9", "memset:reused:0:6M:9", "kfill:post:0:1024:0x09090909", "sync#peer",
         "ctx:1", "check:post:4096:9",
         "ctx:0", "unpeer:1", "unpeer:1#again",
         "memset:pre:0:4096:7#revoked", "access:pre:0#revoked", "access:pre:1#revoked",
         "ctx:1", "fill:pre:4M:5",
         "ctx:0", "kfill:pre:0:1024#fault", "sync#fault"]


def gpus():
    if shutil.which("nvidia-smi") is None:
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([l for l in r.stdout.splitlines() if l.startswith("GPU ")]) if r.returncode == 0 else 0


def main():
    ap = argparse.ArgumentParser()
    for a in ("--vlaked", "--hook", "--tenant"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    if gpus() < 2:
        print("SKIP: fewer than 2 GPUs here")
        return SKIP
    topo = subprocess.run(["nvidia-smi", "topo", "-p2p", "rw"], capture_output=True, text=True).stdout
    print(topo)

    work = tempfile.mkdtemp(prefix="vlake-peer-")
    daemon = None
    try:
        daemon = ns.Daemon(args.vlaked, work, "version: 1\ndefault:\n  limit: 1GiB\n")
        sock = daemon.sock
        env = dict(os.environ, LD_PRELOAD=args.hook, VLAKE_SOCKET=sock, VLAKE_RESERVE="64MiB", VLAKE_LOG="debug")
        t = subprocess.run([args.tenant] + STEPS, env=env, capture_output=True, text=True, timeout=300)
        s = steps_out(t.stdout)
        print(t.stdout + t.stderr[-4000:])
        rc = lambda k: s.get(k, {}).get("rc")  # noqa: E731
        get = lambda k, f: s.get(k, {}).get(f)  # noqa: E731
        check("before peer access: GPU 0 has no access to GPU 1's served memory",
              get("access:pre:0#before", "flags") == "0" and rc("memset:pre:0:4096:7#before") != "0",
              "access %s, memset rc %s" % (get("access:pre:0#before", "flags"), rc("memset:pre:0:4096:7#before")))
        check("cuCtxEnablePeerAccess 0, then 704", rc("peer:1") == "0" and rc("peer:1#again") == "704",
              "%s, %s" % (rc("peer:1"), rc("peer:1#again")))
        check("after it GPU 0 has read-write access to the allocation made before",
              get("access:pre:0#after", "flags") == READ_WRITE and get("access:pre:1#after", "flags") == READ_WRITE
              and rc("memset:pre:0:4096:7#after") == "0",
              "access GPU0 %s GPU1 %s, memset rc %s" % (get("access:pre:0#after", "flags"),
                                                      get("access:pre:1#after", "flags"),
                                                      rc("memset:pre:0:4096:7#after")))
        check("the block reused from the local reserve is the one freed",
              get("alloc:reused:6M", "ptr") == get("alloc:r:6M", "ptr"),
              "%s vs %s" % (get("alloc:reused:6M", "ptr"), get("alloc:r:6M", "ptr")))
        check("GPU 0's memsets and kernel writes into new and reused allocations of GPU 1 work",
              rc("memset:post:0:8M:9") == "0" and rc("memset:reused:0:6M:9") == "0" and
              rc("kfill:post:0:1024:0x09090909") == "0" and rc("sync#peer") == "0",
              "memset %s / %s, kfill %s, sync %s" % (rc("memset:post:0:8M:9"), rc("memset:reused:0:6M:9"),
                                                     rc("kfill:post:0:1024:0x09090909"), rc("sync#peer")))
        check("GPU 1 reads what GPU 0 wrote", get("check:post:4096:9", "ok") == "1", str(s.get("check:post:4096:9")))
        check("cuCtxDisablePeerAccess 0, then 705", rc("unpeer:1") == "0" and rc("unpeer:1#again") == "705",
              "%s, %s" % (rc("unpeer:1"), rc("unpeer:1#again")))
        revoked = get("access:pre:0#revoked", "flags") == "0"
        if revoked:
            check("revoked: no access from GPU 0, GPU 1 keeps its own, GPU 0's kernel write faults (700)",
                  get("access:pre:1#revoked", "flags") == READ_WRITE and rc("sync#fault") == "700",
                  "GPU1 access %s, memset rc %s, sync rc %s" % (get("access:pre:1#revoked", "flags"),
                                                                rc("memset:pre:0:4096:7#revoked"), rc("sync#fault")))
        else:
            print("INFO the driver refused the revocation: GPU 0 keeps access (flags %s); the hook's log: %s"
                  % (get("access:pre:0#revoked", "flags"),
                     [l for l in t.stderr.splitlines() if "revok" in l.lower()][:3]))
            check("a refused revocation is logged by the hook and nothing else fails",
                  any("revok" in l.lower() for l in t.stderr.splitlines()) and rc("sync#fault") == "0",
                  "sync rc %s" % rc("sync#fault"))
    finally:
        ns.clean_up(check, daemon, work)
    return check.table()


if __name__ == "__main__":
    sys.exit(main())
