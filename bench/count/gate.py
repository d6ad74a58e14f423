#!/usr/bin/env python3
"""Instruction-count gates of the hot paths (docs/benchmarks.md, "Instruction-count gates").

  gate.py --build DIR [--baseline FILE] [--tolerance 0.10] [--json OUT] [--update]
  gate.py --compare MEASURED.json --baseline FILE [--tolerance 0.10]

Counts instructions with valgrind's callgrind against the simulated driver (no GPU), where a
count is deterministic and timing is not:
- tenant paths (vlake_bench_count, only its vlake_count_loop() collected, so start-up, exit and
  the hook's worker thread are not counted): a warm alloc/free pair of 2 MiB (the hook's local
  reserve), a kernel launch, a 4 KiB cuMemcpyHtoD_v2, cuMemGetInfo_v2. Each runs natively
  (the simulated driver alone) and under libvlake-hook.so, each count the difference between
  runs of 250 and 50 calls divided by 200 (so warm-up and one-time costs cancel). The gated
  figure is the hook's own cost per call: for the warm pair the hooked count (the hook serves
  it without the driver), for the others hooked minus native (what the pass-through adds).
- one daemon grant: a grant and a release of 2 MiB made straight to vlake::pool::Node, the
  daemon's decisions, in vlake_bench_count_grant (tests/bench/count_grant.cpp; only its
  vlake_count_grants() collected), 50 and 250 pairs, the difference over 200. vlaked's socket
  part is not counted: valgrind 3.19 (Debian bookworm) does not implement pidfd_open, which
  vlaked needs for every session.
The measured counts are compared with the baseline file (bench/count/baseline.json): a count
more than --tolerance (10 %) above its baseline fails the gate (exit 1); one more than 10 %
below passes with a note that the baseline can be lowered. --update writes the measured counts
as the new baseline (a reviewed change). The baseline records the compiler and build type it
was measured with; another compiler or build type skips the gate (exit 77, ctest SKIP).
"""
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

LO, HI = 50, 250
OPS = ("pair", "launch", "memcpy", "meminfo")
HERE = os.path.dirname(os.path.abspath(__file__))


def callgrind_total(out_file):
    """The instruction total of a callgrind output file (its summary/totals line)."""
    with open(out_file) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError("no totals in " + out_file)


def build_info(build):
    """The compiler and build type of a CMake build directory (from its cache)."""
    info = {"compiler": "?", "build_type": "?"}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            cache = f.read()
    except OSError:
        return info
    m = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", cache, re.M)
    info["build_type"] = m.group(1).strip() if m else "?"
    m = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.*)$", cache, re.M)
    cxx = m.group(1).strip() if m else "c++"
    try:
        v = subprocess.run([cxx, "-dumpfullversion"], capture_output=True, text=True, timeout=30).stdout.strip()
        info["compiler"] = "%s %s" % (os.path.basename(cxx), v)
    except OSError:
        pass
    m = re.search(r"^CMAKE_CXX_FLAGS:\w+=(.*)$", cache, re.M)
    if m and "-fsanitize" in m.group(1):
        info["build_type"] += " (sanitizers)"
    return info


class Env:
    def __init__(self, build, work):
        self.build, self.work = build, work
        self.sim = os.path.join(build, "sim", "libcuda.so.1")
        self.hook = os.path.join(build, "hook", "libvlake-hook.so")
        self.tenant = os.path.join(build, "bench", "vlake_bench_count")
        self.vlaked = os.path.join(build, "pool", "vlaked")
        self.node = "count-%d" % os.getpid()
        self.env = dict(os.environ, VLAKE_SIM_NODE=self.node, VLAKE_SIM_DEVICE_MEMORY="8GiB",
                        VLAKE_SIM_DEVICE_COUNT="1")
        self.env.pop("LD_PRELOAD", None)
        self.config = os.path.join(work, "vlake.yaml")
        with open(self.config, "w") as f:
            f.write("version: 1\ndefault:\n  limit: 4GiB\n")
        self.daemon = None
        self.n = 0

    def start_daemon(self):
        sock = os.path.join(self.work, "vlaked.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        self.n += 1
        argv = [self.vlaked, "--config", self.config, "--socket", sock, "--state", "vlake-count-%d-%d" % (os.getpid(), self.n),
                "--metrics-address", "none", "--driver", self.sim, "--nvml", "none"]
        self.log = open(os.path.join(self.work, "vlaked-%d.log" % self.n), "w")
        self.daemon = subprocess.Popen(argv, stdout=self.log, stderr=self.log, env=self.env)
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("vlaked did not start; see " + self.log.name)
            time.sleep(0.05)
        self.sock = sock

    def stop_daemon(self):
        if self.daemon:
            self.daemon.terminate()
            try:
                self.daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
            self.log.close()
            self.daemon = None
        for name in os.listdir("/dev/shm"):
            if name.startswith("vlake-count-%d-" % os.getpid()):
                os.unlink(os.path.join("/dev/shm", name))

    def grant_run(self, n):
        out = os.path.join(self.work, "cg.grant.%d" % n)
        argv = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=vlake_count_grants",
                "--callgrind-out-file=" + out, os.path.join(self.build, "tests", "bench", "vlake_bench_count_grant")]
        p = subprocess.run(argv, capture_output=True, text=True, env=dict(self.env, VLAKE_COUNT_GRANTS=str(n)),
                           timeout=300)
        if p.returncode != 0:
            raise RuntimeError("vlake_bench_count_grant x%d failed (exit %d): %s" % (n, p.returncode,
                                                                                 (p.stdout + p.stderr).strip()[-400:]))
        return callgrind_total(out)

    def tenant_run(self, op, n, hooked, reserve="4GiB", callgrind=True):
        out = os.path.join(self.work, "cg.%s.%d.%d.%d" % (op, n, hooked, self.n))
        env = dict(self.env)
        if hooked:
            env.update(LD_PRELOAD=self.hook, VLAKE_SOCKET=self.sock, VLAKE_RESERVE=reserve)
        argv = [self.tenant, "--op", op, "--iterations", str(n), "--warmup", "3", "--driver", self.sim]
        if callgrind:
            argv = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=vlake_count_loop",
                    "--callgrind-out-file=" + out] + argv
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            raise RuntimeError("%s %s x%d failed (exit %d): %s" % ("hooked" if hooked else "native", op, n, p.returncode,
                                                                 p.stderr.strip()[-400:]))
        return callgrind_total(out) if callgrind else None

    def cleanup(self):
        self.stop_daemon()
        for name in os.listdir("/dev/shm"):
            if name.startswith("vlake-sim-" + self.node):
                os.unlink(os.path.join("/dev/shm", name))


def measure(build):
    work = tempfile.mkdtemp(prefix="vlake-count-")
    e = Env(build, work)
    counts = {}
    try:
        e.start_daemon()
        for op in OPS:
            per = {}
            for hooked in (False, True):
                lo = e.tenant_run(op, LO, hooked)
                hi = e.tenant_run(op, HI, hooked)
                per[hooked] = (hi - lo) / (HI - LO)
            # The warm pair never reaches the driver (the hook serves it): its cost is the hooked
            # count itself. The others pass through: their cost is what the hook adds.
            gated = per[True] if op == "pair" else per[True] - per[False]
            counts["tenant." + op] = {"native": round(per[False], 1), "hooked": round(per[True], 1),
                                      "gated": round(gated, 1)}
        e.stop_daemon()
        totals = [e.grant_run(n) for n in (LO, HI)]
        counts["daemon.grant"] = {"gated": round((totals[1] - totals[0]) / (HI - LO), 1)}
    finally:
        e.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    return counts


def compare(measured, baseline, tolerance):
    """Lines of the comparison and whether the gate holds."""
    ok = True
    lines = []
    base = baseline.get("counts", {})
    for name in sorted(set(measured) | set(base)):
        m = (measured.get(name) or {}).get("gated")
        b = (base.get(name) or {}).get("gated")
        if m is None or b is None:
            lines.append("%-16s %12s %12s   %s" % (name, b, m, "FAIL (missing)" if m is None else "new (no baseline)"))
            ok = ok and m is not None
            continue
        ratio = m / b if b else (1.0 if m == 0 else float("inf"))
        if ratio > 1 + tolerance:
            verdict = "FAIL (+%.1f%% > %.0f%%)" % ((ratio - 1) * 100, tolerance * 100)
            ok = False
        elif ratio < 1 - tolerance:
            verdict = "ok (%.1f%%: the baseline can be lowered with --update)" % ((ratio - 1) * 100)
        else:
            verdict = "ok (%+.1f%%)" % ((ratio - 1) * 100)
        lines.append("%-16s %12.1f %12.1f   %s" % (name, b, m, verdict))
    return ok, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", help="build directory (targets vlaked vlake_hook vlake_sim vlake_bench_count)")
    ap.add_argument("--baseline", default=os.path.join(HERE, "baseline.json"))
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--json", help="write the measured counts here")
    ap.add_argument("--update", action="store_true", help="write the measured counts as the baseline")
    ap.add_argument("--compare", help="compare a measured JSON (from --json) with the baseline; measure nothing")
    a = ap.parse_args()
    try:
        with open(a.baseline) as f:
            baseline = json.load(f)
    except (OSError, ValueError):
        baseline = {}
    if a.compare:
        with open(a.compare) as f:
            measured = json.load(f)
        ok, lines = compare(measured.get("counts", {}), baseline, a.tolerance)
        print("\n".join(lines))
        return 0 if ok else 1
    if not a.build:
        ap.error("--build DIR (or --compare FILE)")
    if not shutil.which("valgrind"):
        print("gate.py: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 77 if not a.update else 2
    build = os.path.abspath(a.build)
    info = build_info(build)
    if not a.update and baseline and (baseline.get("compiler"), baseline.get("build_type")) != (info["compiler"],
                                                                                                info["build_type"]):
        print("gate.py: the baseline was counted with %s, %s; this build is %s, %s: skipped" % (
            baseline.get("compiler"), baseline.get("build_type"), info["compiler"], info["build_type"]))
        return 77
    t0 = time.monotonic()
    counts = measure(build)
    result = dict(info, version=1, machine=platform.machine(), counts=counts,
                  tolerance=a.tolerance, seconds=round(time.monotonic() - t0, 1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print("instructions per call (callgrind, simulated driver, %s, %s; %.0f s)" % (info["compiler"], info["build_type"],
                                                                                  result["seconds"]))
    print("%-16s %12s %12s %12s" % ("path", "native", "hooked", "gated"))
    for name, c in counts.items():
        print("%-16s %12s %12s %12.1f" % (name, c.get("native", "-"), c.get("hooked", "-"), c["gated"]))
    if a.update:
        out = {k: result[k] for k in ("version", "compiler", "build_type", "machine", "tolerance")}
        out["counts"] = counts
        with open(a.baseline, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        print("gate.py: baseline written to " + a.baseline)
        return 0
    if not baseline:
        print("gate.py: no baseline at %s (write one with --update)" % a.baseline, file=sys.stderr)
        return 1
    print("\n%-16s %12s %12s   %s" % ("path", "baseline", "measured", "gate (fails above +%.0f%%)" % (a.tolerance * 100)))
    ok, lines = compare(counts, baseline, a.tolerance)
    print("\n".join(lines))
    print("gate.py: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
