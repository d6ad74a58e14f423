#!/usr/bin/env python3
"""Hostile tenants against a real vlaked: what an untrusted tenant tries, and what must happen.

Runs on the real driver (label gpu) or on the simulator (--sim, label sim). Tenants are
vlake_pool_test_client processes under their own uids: they speak the protocol themselves,
keep descriptors, map what they get read-write and call the driver directly. Checks (a table
at the end; exit 0 only if every check passed, 77 = skipped):
  1. keep a grant's descriptor, release, let another tenant get memory of that size, import the
     kept descriptor again: it is not the other tenant's memory (no read, no write crosses), the
     memory stays charged to the tenant that kept it, and that tenant is still served up to its
     limit (what it gave back is released first);
  2. release a grant as exported while keeping its descriptor: still charged (the tenant's next
     grant is refused at its limit), NVML shows the memory alive; charge and memory go once the
     descriptor is closed;
  3. share identical content from two tenants outside any trust domain: nothing is merged (no
     content oracle), and writing through a read-write mapping of one's "shared" chunk leaves
     the other's data intact;
  4. VLAKE_DISABLE=1 where the quota file does not allow it: the hook stays on and the
     over-limit allocation fails; where it allows it: passes through and is attributed to the
     tenant as memory outside vlake;
  5. memory allocated by a process that loads the driver itself (no hook, no session): attributed
     to its uid's tenant; that tenant's grants are refused (enforce: refuse/kill), and with
     enforce: kill the process is killed after the grace period;
  6. reconciliation while 4 tenants (one unhooked) hold memory: NVML's used memory equals the
     daemon's per-tenant usage + its free pool + its own context (measured before any tenant
     came) within 64 MiB. No term is derived from another.

  hostile.py --vlaked PATH --client PATH --tenant PATH --hook PATH --state-tool PATH
             [--driver LIB] [--nvml LIB] [--sim] [--keep]
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
from checks import Checks, testprocs  # noqa: E402
import node_slice as ns  # noqa: E402  (clean_up)
MiB = 1 << 20
GiB = 1 << 30
SKIP = 77
UID_A, UID_B, UID_C, UID_D, UID_E, UID_F = 2001, 2002, 2003, 2004, 2005, 2006

check = Checks()


class Client:
    """One vlake_pool_test_client process (one tenant process)."""

    def __init__(self, path, driver, uid, gid, env):
        self.p = subprocess.Popen([path, "--driver", driver, "--uid", str(uid), "--gid", str(gid)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        first = self.p.stdout.readline()
        if not first.startswith("ok ready"):
            raise RuntimeError("client did not start: " + first)
        self.pid = int(first.split("pid=")[1])

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        if not out.startswith("ok"):
            raise RuntimeError("%s -> %s" % (line, out or "(no answer: exited %s)" % self.p.poll()))
        kv = {}
        for tok in out.split()[1:]:
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv[k] = int(v) if v.lstrip("-").isdigit() else v
        return kv

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.write("exit\n")
                self.p.stdin.flush()
                self.p.wait(timeout=30)
            except Exception:
                self.p.kill()
                self.p.wait()


class Daemon:
    def __init__(self, vlaked, work, config, driver, nvml, env):
        self.sock = os.path.join(work, "vlaked.sock")
        self.state = "vlake-hostile-%d" % os.getpid()
        self.cfg = os.path.join(work, "vlake.yaml")
        with open(self.cfg, "w") as f:
            f.write(config)
        self.log_path = os.path.join(work, "vlaked.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([vlaked, "--config", self.cfg, "--socket", self.sock, "--state", self.state,
                                      "--driver", driver, "--nvml", nvml, "--sample-interval-ms", "200",
                                      "--metrics-address", "none", "--log-level", "info"],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("vlaked did not start; see " + self.log_path)
            time.sleep(0.1)
        os.chmod(os.path.dirname(self.sock), 0o755)
        os.chmod(self.sock, 0o666)

    def stop(self):
        testprocs.stop(self.proc)
        self.log.close()
        testprocs.unlink_quiet(testprocs.state_path(self.state))


def gpu_users(nv):
    """(pid, uid, listed by NVML, command) of every process with a CUDA device file open."""
    listed = nv.processes()
    users = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
            targets = set()
            for fd in fds:
                try:
                    targets.add(os.readlink("/proc/%s/fd/%s" % (pid, fd)))
                except OSError:
                    pass
            if not any(t.startswith("/dev/nvidia-uvm") or t.startswith("/dev/shm/vlake-sim-") for t in targets):
                continue
            uid = os.stat("/proc/%s" % pid).st_uid
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")[0].decode(errors="replace").rsplit("/", 1)[-1]
            users.append((int(pid), uid, int(pid) in listed, cmd))
        except OSError:
            continue
    return users


def main():
    ap = argparse.ArgumentParser()
    for a in ("--vlaked", "--client", "--tenant", "--hook", "--state-tool"):
        ap.add_argument(a, required=True)
    ap.add_argument("--driver", default="libcuda.so.1")
    ap.add_argument("--nvml", default="libnvidia-ml.so.1")
    ap.add_argument("--sim", action="store_true", help="the driver and NVML are the simulator's")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (tenants run under their own uids)")
        return SKIP

    env = dict(os.environ)
    # Tenants are told apart by uid. On the simulator they keep gid 0: the simulated GPU is a
    # group-writable file of root's (created under umask 0002).
    group_of = (lambda uid: 0) if args.sim else (lambda uid: uid)
    if args.sim:
        os.umask(0o002)
        node = "hostile-%d" % os.getpid()
        env.update(VLAKE_SIM_NODE=node, VLAKE_SIM_DEVICE_MEMORY="16GiB", VLAKE_SIM_CONTEXT_MEMORY="8MiB",
                   LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.driver)))
    else:
        try:
            from nvml import Nvml
            Nvml()
        except Exception as e:  # no GPU, no NVML
            print("SKIP: no GPU here (%s)" % e)
            return SKIP
    if args.sim:  # the simulated NVML reads the node this process names
        os.environ.update(VLAKE_SIM_NODE=env["VLAKE_SIM_NODE"], VLAKE_SIM_DEVICE_MEMORY="16GiB")
    from nvml import Nvml
    nv = Nvml(library=args.nvml) if args.sim else Nvml()

    limit = 4 * GiB
    unit = 64 * MiB
    config = """version: 1
default:
  limit: 4GiB
namespaces:
  - name: open
    pod_limit: 4GiB
    dedup: transparent
    users: [%d, %d, %d]
  - name: strict
    pod_limit: 4GiB
    enforce: kill
    kill_grace: 3s
    users: [%d]
  - name: lax
    pod_limit: 4GiB
    enforce: account
    allow_disable: true
    users: [%d]
  - name: plain
    pod_limit: 4GiB
    enforce: refuse
    users: [%d]
""" % (UID_A, UID_B, UID_C, UID_D, UID_E, UID_F)

    work = tempfile.mkdtemp(prefix="vlake-hostile-")
    os.chmod(work, 0o755)
    daemon = Daemon(args.vlaked, work, config, args.driver, args.nvml, env)
    clients = []

    def state():
        out = subprocess.run([args.state_tool, "--state", daemon.state, "--json"], capture_output=True, text=True,
                             timeout=30)
        if out.returncode != 0:
            raise RuntimeError("state tool: " + out.stderr)
        return json.loads(out.stdout)

    def tenant(st, uid):
        for t in st["tenants"]:
            if t["name"].endswith("uid:%d" % uid) or t["name"].endswith(":%d" % uid):
                return t
        return None

    def client(uid):
        c = Client(args.client, args.driver, uid, group_of(uid), env)
        clients.append(c)
        return c

    def settle(seconds=1.5):
        time.sleep(seconds)  # several sampling intervals (200 ms) of the daemon

    try:
        settle()

        # 1. keep a descriptor, then read/write after another tenant got memory of that size
        a = client(UID_A)
        b = client(UID_B)
        a.cmd("connect " + daemon.sock)
        b.cmd("connect " + daemon.sock)
        g = a.cmd("grant %d alloc keep" % unit)
        a.cmd("fill %d 161" % g["id"])
        a.cmd("release %d" % g["id"])
        gb = b.cmd("grant %d" % unit)
        b.cmd("fill %d 178" % gb["id"])
        k = a.cmd("reimport %d" % g["id"])["id"]
        sees_b = a.cmd("check %d 178" % k)["match"] == 1
        check("kept descriptor does not reach the next tenant's data", not sees_b,
              "tenant A's re-imported memory %s tenant B's bytes" % ("holds" if sees_b else "does not hold"))
        a.cmd("fill %d 17" % k)
        b_ok = b.cmd("check %d 178" % gb["id"])["match"] == 1
        check("writing through a kept descriptor leaves the next tenant's data intact", b_ok)
        settle()
        ta = tenant(state(), UID_A)
        check("memory reachable through a kept descriptor stays charged to its tenant",
              ta is not None and ta["retained"][0] >= unit,
              "tenant A: granted %s retained %s" % (ta and ta["granted"][0], ta and ta["retained"][0]))
        a.cmd("forget %d" % k)
        a.cmd("closekept %d" % g["id"])
        # An honest tenant is never refused for memory it gave back: at its limit, its retained
        # handles are released first.
        u = a.cmd("usage")
        full = a.cmd("grant %d" % (limit - u["used"]))
        ta = tenant(state(), UID_A)
        check("a tenant at its limit is served despite retained memory (released first)", full["status"] == 0,
              "usage %d MiB, grant of the rest: status %d; retained now %s"
              % (u["used"] // MiB, full["status"], ta and ta["retained"][0]))
        if full["status"] == 0:
            a.cmd("release %d" % full["id"])

        # 2. release-as-exported, keep the memory
        big = 4 * unit
        g = a.cmd("grant %d alloc keep" % big)
        a.cmd("release %d 1" % g["id"])  # kReleaseExported
        settle()
        st = state()
        ta = tenant(st, UID_A)
        used_kept = nv.memory()["used"]
        check("released-as-exported memory kept through a descriptor stays charged",
              ta is not None and ta["retained"][0] >= big and st["counters"]["handles_retired_held"] >= 1,
              "retained %s, held-descriptor retirements %s" % (ta and ta["retained"][0],
                                                               st["counters"]["handles_retired_held"]))
        u = a.cmd("usage")
        over = a.cmd("grant %d" % (limit - u["used"] + unit))
        check("its next grant beyond the limit (counting the kept memory) is refused", over["status"] != 0,
              "usage %d MiB, grant status %d" % (u["used"] // MiB, over["status"]))
        a.cmd("closekept %d" % g["id"])
        settle()
        ta = tenant(state(), UID_A)
        back = used_kept - nv.memory()["used"]
        check("the kept memory was alive on the GPU; closing the descriptor uncharges it and frees it",
              (ta is None or ta["retained"][0] == 0) and back >= big - 2 * MiB,
              "retained %s; NVML used fell by %.0f MiB when the descriptor closed (grant %d MiB)"
              % (ta and ta["retained"][0], back / MiB, big // MiB))

        # 3. dedup outside a trust domain
        c = client(UID_C)
        c.cmd("connect " + daemon.sock)
        ga = a.cmd("grant %d" % unit)
        a.cmd("fill %d 92" % ga["id"])
        sa = a.cmd("share %d" % ga["id"])
        gc = c.cmd("grant %d" % unit)
        c.cmd("fill %d 92" % gc["id"])
        sc = c.cmd("share %d" % gc["id"])
        # Each grant's 32 chunks hold the same bytes, so a share merges 31 of them with its own
        # first one; matching the other tenant's would merge all 32.
        check("identical content of two tenants without a shared trust domain is not merged (no oracle)",
              sc.get("merged", -1) == sa.get("merged", -2) and sc.get("merged", 0) < sc.get("shared", 0),
              "A's share: merged %s of %s; C's: merged %s of %s"
              % (sa.get("merged"), sa.get("shared"), sc.get("merged"), sc.get("shared")))
        if "id" in sc and "id" in sa:
            c.cmd("fill %d 153" % sc["id"])
            intact = a.cmd("check %d 92" % sa["id"])["match"] == 1
            check("writing into one's 'shared' chunk read-write leaves the other tenant's data intact", intact)

        # 4. VLAKE_DISABLE
        hooked = dict(env, LD_PRELOAD=args.hook, VLAKE_SOCKET=daemon.sock, VLAKE_DISABLE="1")
        over_limit = "%dM" % ((limit + 512 * MiB) // MiB)
        p = subprocess.run([args.tenant, "init", "alloc:1:" + over_limit], env=hooked, capture_output=True,
                           text=True, timeout=120, user=UID_F, group=group_of(UID_F), extra_groups=[])
        line = [x for x in p.stdout.splitlines() if x.startswith("alloc:1")]
        refused = bool(line) and "rc=0" not in line[0]
        check("VLAKE_DISABLE=1 where the quota file does not allow it: the limit still holds", refused,
              (line[0] if line else p.stdout[-200:]) + " | " + p.stderr.strip()[-200:])
        e_proc = subprocess.Popen([args.tenant, "init", "alloc:1:" + over_limit, "sleep:6000"], env=hooked,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user=UID_E,
                                  group=group_of(UID_E), extra_groups=[])
        settle(3)
        te = tenant(state(), UID_E)
        check("VLAKE_DISABLE=1 where allowed: passes through, attributed as memory outside vlake",
              te is not None and te["unhooked"][0] >= limit,
              "tenant E unhooked %s MiB" % (te and te["unhooked"][0] // MiB))
        e_out = e_proc.communicate(timeout=60)

        # 5. a process that loads the driver itself
        d_raw = client(UID_D)
        d_raw.cmd("own %d" % (limit // 2))
        d = client(UID_D)
        d.cmd("connect " + daemon.sock)
        settle()
        st = state()
        td = tenant(st, UID_D)
        check("memory of a process without the hook is attributed to its uid's tenant",
              td is not None and td["unhooked"][0] >= limit // 2,
              "tenant D unhooked %s MiB; every tenant's memory outside vlake: %s; unlisted %s MiB; GPU users "
              "(pid, uid, listed by NVML): %s"
              % (td and td["unhooked"][0] // MiB,
                 {t["name"]: t["unhooked"][0] // MiB for t in st["tenants"] if t["unhooked"][0]},
                 st["devices"][0].get("unlisted_bytes", 0) // MiB, gpu_users(nv)))
        r = d.cmd("grant %d" % (limit // 2 + unit))
        check("grants that would pass the limit with that memory are refused", r["status"] != 0,
              "status %d used %d MiB" % (r["status"], r.get("used", 0) // MiB))
        d_raw.cmd("own %d" % (limit // 2 + unit))  # now over the limit outside vlake
        deadline = time.time() + 20
        while d_raw.p.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        killed = d_raw.p.poll() == -signal.SIGKILL
        st = state()
        check("enforce: kill ends the process over its limit after the grace period",
              killed and st["counters"]["unhooked_kills"] >= 1,
              "exit %s, kills counted %s" % (d_raw.p.poll(), st["counters"]["unhooked_kills"]))

        # 6. reconciliation: 4 tenants hold memory, one of them unhooked
        holders = [client(UID_B), client(UID_C), client(UID_F)]
        for h, n in zip(holders, (6, 10, 3)):
            h.cmd("connect " + daemon.sock)
            h.cmd("grant %d" % (n * unit))
        raw = client(UID_E)
        raw.cmd("own %d" % (5 * unit))
        settle(2)
        st = state()
        mem = nv.memory()
        dev = st["devices"][0]
        per = {t["name"]: {k: t[k][0] // MiB for k in ("granted", "nonpool", "retained", "unhooked")}
               for t in st["tenants"]}
        print("tenants (MiB):", json.dumps(per))
        print("device:", json.dumps(dev))
        print("NVML processes (MiB):", {p: b // MiB for p, b in nv.processes().items()}, "daemon pid", daemon.proc.pid)
        for c in clients:
            c.close()
        settle(2)
        idle = state()["devices"][0]
        daemon_ctx = nv.processes().get(daemon.proc.pid, 0) - idle["pool_bytes"]
        # The daemon creates its context lazily (not there at start): measured once the tenants left.
        check.reconcile("NVML used = Σ tenants + free pool + daemon context (within 64 MiB)", st, mem["used"],
                        daemon_ctx)
        del e_out
    finally:
        for c in clients:
            c.close()
        ns.clean_up(check, daemon, work, args.keep)

    return check.table(90)


if __name__ == "__main__":
    sys.exit(main())
