#!/usr/bin/env python3
"""Interleaved native/hooked pairs: the harness of bench/run.sh's user-facing rows
(docs/benchmarks.md, "Interleaved pairs").

  pairs.py SUITE --out DIR [--pairs 10] [--warmup 2] [--hook-env NAME=VALUE ...]
           [--build DIR] [--driver PATH] [--work DIR] [--quick] [--seed 1]

A row measures one thing (decode tokens/s, launches/s, load seconds, ...) natively (A) and under
the hook (B). Two ways to measure:
- a persistent worker per side (launch, decode, load, train): A and B are started once per row
  group (same environment except --hook-env for B), each prints a JSON line with "ready" once
  set up, then answers each command line written to its stdin with one JSON line holding
  "value" (or "error"). Both stay alive for the whole group; only one measures at a time.
- a fresh command per measurement (start: the row is about process start-up itself).
Each row: --warmup measurements per side first (A B A B ...; not kept), then --pairs pairs, the
order alternating (A B, B A, A B, ...) so that drift over the run does not favour a side. Each
pair's ratio is B's value over A's; the row's ratio is the median of the pair ratios with a
bootstrap 95% interval of that median (10 000 resamples, seeded). With nvidia-smi present,
each pair records the GPU's SM and memory clocks, temperature and power before it (noise
diagnostics: clocks are never changed). --cpus pins both sides' processes to the same CPUs
(default "auto": the CPUs local to GPU 0, from sysfs, that this process may use; "none": no
pinning), so that neither side runs on another NUMA node or is moved there mid-row. Writes
DIR/pairs_<row>.json per row:
  {"bench":"pairs","row","suite","unit","better":"higher"|"lower","ratio","ci95":[lo,hi],
   "a_median","b_median","n_pairs","asked_pairs","warmup","pairs":[{"a","b","ratio","order",
   "gpu"}],"errors":[...],"cpus":[...]|null,"a_extra","b_extra"}
and the workers' stderr to DIR/pairs_<group>_<a|b>.log. Exit 0 when every row has at least one
pair, 1 otherwise (the rows' files are written either way), 2 for bad arguments.
"""
import argparse
import json
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
READY_TIMEOUT_S = 600
MEASURE_TIMEOUT_S = 600


class Row:
    def __init__(self, name, command, unit, better, group, env=None, warmup=None):
        self.name, self.command, self.unit, self.better = name, command, unit, better
        self.group, self.env, self.warmup = group, env or {}, warmup


def suites(a):
    """The suites' rows and workers, given the parsed arguments."""
    b = a.build
    drv = ["--driver", a.driver] if a.driver else []
    py = sys.executable
    torch_dir = os.path.join(BENCH, "torch")
    tokens = 32 if a.quick else 128
    steps = 10 if a.quick else 30
    model = ["--layers", "12", "--d", "1024", "--heads", "16", "--seq", "1024", "--batch", "8"]
    start_counts = [int(x) for x in a.start_processes.split(",") if x]
    return {
        "launch": {
            "worker": [os.path.join(b, "bench", "vlake_bench_launch"), "--serve"] + drv,
            "rows": [Row("launch_loop", "loop 20000", "launches/s", "higher", "launch"),
                     Row("launch_graph", "graph 20000 100", "launches/s", "higher", "launch")],
        },
        "decode": {
            "worker": [py, os.path.join(torch_dir, "decode.py"), "--serve"],
            "rows": [Row("decode_b1", "decode batch=1 tokens=%d" % tokens, "tokens/s", "higher", "decode"),
                     Row("decode_b32", "decode batch=32 tokens=%d" % tokens, "tokens/s", "higher", "decode")],
        },
        "load": {
            "setup": [py, os.path.join(torch_dir, "load.py"), "--write", os.path.join(a.work, "model.safetensors"),
                      "--gib", "1" if a.quick else "4"],
            "worker": [py, os.path.join(torch_dir, "load.py"), "--serve", "--file",
                       os.path.join(a.work, "model.safetensors")],
            "rows": [Row("load_model", "load", "s", "lower", "load")],
        },
        "train": {
            "worker": [py, os.path.join(torch_dir, "train_step.py"), "--serve"] + model,
            "rows": [Row("train_default", "steps steps=%d" % steps, "ms", "lower", "train_default",
                         {"PYTORCH_CUDA_ALLOC_CONF": ""}),
                     Row("train_expandable", "steps steps=%d" % steps, "ms", "lower", "train_expandable",
                         {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})],
        },
        # One warm-up per side before the first count only: a measurement is a whole start-up
        # (128 processes take tens of seconds), and the driver is warm after the first.
        "start": {
            "command": True,
            "rows": [Row("start_%d" % n, [os.path.join(b, "bench", "vlake_bench_start"), "--processes", str(n),
                                          "--timeout-s", "300"] + drv,
                         "s", "lower", "start_%d" % n, warmup=1 if i == 0 else 0)
                     for i, n in enumerate(start_counts)],
        },
    }


def parse_cpulist(text):
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    out = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def gpu_local_cpus():
    """The CPUs local to GPU 0 (nvidia-smi's PCI bus id, then sysfs), or None."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        bus = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dom, rest = bus.split(":", 1)
        path = "/sys/bus/pci/devices/%s:%s/local_cpulist" % (dom[-4:].lower(), rest.lower())
        with open(path) as f:
            return parse_cpulist(f.read())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def pick_cpus(spec):
    """The CPUs both sides run on (sorted list), or None for no pinning."""
    if spec == "none":
        return None
    allowed = os.sched_getaffinity(0)
    want = gpu_local_cpus() if spec == "auto" else parse_cpulist(spec)
    cpus = sorted((want or set()) & allowed)
    return cpus or None


def gpu_state():
    """The GPU's clocks, temperature and power now (nvidia-smi), or None."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                              "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True, timeout=10)
        sm, mem, temp, power = [x.strip() for x in out.stdout.strip().split(",")[:4]]
        num = lambda x: float(x) if x.replace(".", "", 1).isdigit() else None
        return {"sm_mhz": num(sm), "mem_mhz": num(mem), "temp_c": num(temp), "power_w": num(power)}
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


class Worker:
    """A persistent worker process: one command line in, one JSON line out."""

    def __init__(self, argv, env, log_path, cpus=None):
        self.argv = argv
        self.log = open(log_path, "a")
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                  env=env, text=True, bufsize=1, preexec_fn=pinner(cpus))
        self.buf = ""

    def read_json(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                if line.startswith("{"):
                    try:
                        return json.loads(line)
                    except ValueError:
                        pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("no answer from %s within %d s" % (os.path.basename(self.argv[1 if self.argv[0] == sys.executable else 0]), timeout))
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if r:
                chunk = os.read(self.p.stdout.fileno(), 65536).decode(errors="replace")
                if not chunk:
                    self.log.flush()
                    raise RuntimeError("worker exited (status %s): %s" % (self.p.wait(), log_tail(self.log.name)))
                self.buf += chunk

    def ready(self):
        r = self.read_json(READY_TIMEOUT_S)
        if not r.get("ready"):
            raise RuntimeError("worker did not report ready: %r" % r)
        return r

    def measure(self, command):
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        r = self.read_json(MEASURE_TIMEOUT_S)
        if "error" in r or not isinstance(r.get("value"), (int, float)):
            raise RuntimeError(r.get("error", "no value in %r" % r))
        return r

    def close(self):
        try:
            if self.p.poll() is None:
                self.p.stdin.write("quit\n")
                self.p.stdin.flush()
                self.p.stdin.close()
                self.p.wait(timeout=60)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.log.close()


def log_tail(path, n=3):
    try:
        with open(path, errors="replace") as f:
            return " | ".join(l.strip() for l in f.readlines()[-n:])
    except OSError:
        return ""


def pinner(cpus):
    """A preexec_fn that pins the child to `cpus` (None: no pinning)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def run_command(argv, env, log_path, cpus=None):
    with open(log_path, "a") as log:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, env=env, text=True, timeout=MEASURE_TIMEOUT_S,
                           preexec_fn=pinner(cpus))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError("%s exited %d: %s" % (os.path.basename(argv[0]), p.returncode, log_tail(log_path)))
    r = json.loads(lines[-1])
    if not isinstance(r.get("value"), (int, float)):
        raise RuntimeError("no value in %r" % r)
    return r


def bootstrap_median(xs, seed, n=10000):
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return [meds[int(0.025 * n)], meds[int(0.975 * n) - 1]]


def summarize(row, suite, pairs, asked, warmup, errors, seed, extra):
    ratios = [p["ratio"] for p in pairs]
    out = {"bench": "pairs", "row": row.name, "suite": suite, "unit": row.unit, "better": row.better,
           "command": row.command if isinstance(row.command, str) else " ".join(os.path.basename(x) if i == 0 else x
                                                                               for i, x in enumerate(row.command)),
           "n_pairs": len(pairs), "asked_pairs": asked, "warmup": warmup, "pairs": pairs, "errors": errors,
           "ratio": statistics.median(ratios) if ratios else None,
           "ci95": bootstrap_median(ratios, seed) if len(ratios) >= 2 else None,
           "a_median": statistics.median(p["a"] for p in pairs) if pairs else None,
           "b_median": statistics.median(p["b"] for p in pairs) if pairs else None}
    out.update(extra)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hook-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--build", default=os.path.join(os.path.dirname(BENCH), "build", "gpu"))
    ap.add_argument("--driver", default="", help="driver library for the C++ workers (default: libcuda.so.1)")
    ap.add_argument("--work", default="", help="scratch directory (the load row's checkpoint); default --out")
    ap.add_argument("--start-processes", default="32,128")
    ap.add_argument("--cpus", default="auto", help="auto (the CPUs local to GPU 0), none, or a list such as 0-7")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    a.work = a.work or a.out
    all_suites = suites(a)
    if a.suite not in all_suites:
        print("pairs.py: unknown suite %r (%s)" % (a.suite, ", ".join(all_suites)), file=sys.stderr)
        return 2
    if a.pairs < 1 or a.warmup < 0:
        print("pairs.py: --pairs >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    hook_env = {}
    for kv in a.hook_env:
        if "=" not in kv:
            print("pairs.py: --hook-env takes NAME=VALUE, got %r" % kv, file=sys.stderr)
            return 2
        k, v = kv.split("=", 1)
        hook_env[k] = v
    os.makedirs(a.out, exist_ok=True)
    s = all_suites[a.suite]
    try:
        cpus = pick_cpus(a.cpus)
    except ValueError:
        print("pairs.py: --cpus takes auto, none or a CPU list such as 0-7,16; got %r" % a.cpus, file=sys.stderr)
        return 2
    base = dict(os.environ)
    for k in hook_env:
        base.pop(k, None)  # side A runs without the hook whatever the caller's environment holds
    if s.get("setup"):
        log = os.path.join(a.out, "pairs_%s_setup.log" % a.suite)
        with open(log, "a") as f:
            if subprocess.run(s["setup"], stdout=f, stderr=f, env=base).returncode != 0:
                print("pairs.py: %s setup failed (see %s)" % (a.suite, log), file=sys.stderr)
                for row in s["rows"]:
                    write(a.out, summarize(row, a.suite, [], a.pairs, a.warmup, ["setup failed"], a.seed, {}))
                return 1
    ok = True
    workers, group = None, None
    try:
        for row in s["rows"]:
            env_a = dict(base, **row.env)
            env_b = dict(env_a, **hook_env)
            errors, pairs, extra = [], [], {}
            if s.get("command"):
                logs = [os.path.join(a.out, "pairs_%s_%s.log" % (row.group, x)) for x in "ab"]
                measure = [lambda r=row, e=env_a, l=logs[0]: run_command(r.command, e, l, cpus),
                           lambda r=row, e=env_b, l=logs[1]: run_command(r.command, e, l, cpus)]
            else:
                if group != row.group:
                    if workers:
                        for w in workers:
                            w.close()
                    workers, group = None, row.group
                    try:
                        workers = [Worker(s["worker"], env, os.path.join(a.out, "pairs_%s_%s.log" % (row.group, x)), cpus)
                                   for env, x in ((env_a, "a"), (env_b, "b"))]
                        ready = [w.ready() for w in workers]
                        extra = {"a_extra": ready[0], "b_extra": ready[1]}
                    except (RuntimeError, OSError) as e:
                        errors.append("worker start: %s" % e)
                        if workers:
                            for w in workers:
                                w.close()
                        workers, group = None, None
                measure = [lambda w=w: w.measure(row.command) for w in workers] if workers else None
            if measure:
                warmup = a.warmup if row.warmup is None else row.warmup
                try:
                    for _ in range(warmup):
                        measure[0]()
                        measure[1]()
                    for i in range(a.pairs):
                        order = "ab" if i % 2 == 0 else "ba"
                        gpu = gpu_state()
                        got = {}
                        for side in order:
                            got[side] = measure[0 if side == "a" else 1]()
                        va, vb = float(got["a"]["value"]), float(got["b"]["value"])
                        if va <= 0 or vb <= 0:
                            errors.append("pair %d: a value <= 0 (%g, %g)" % (i, va, vb))
                            continue
                        pairs.append({"a": va, "b": vb, "ratio": vb / va, "order": order, "gpu": gpu})
                except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
                    errors.append(str(e))
                    if workers:
                        for w in workers:
                            w.close()
                        workers, group = None, None
            r = summarize(row, a.suite, pairs, a.pairs, a.warmup if row.warmup is None else row.warmup, errors, a.seed,
                          dict(extra, cpus=cpus))
            write(a.out, r)
            ok = ok and bool(pairs)
            ci = r["ci95"]
            print("pairs.py: %s: %d/%d pairs, ratio %s%s%s" % (
                row.name, len(pairs), a.pairs, "-" if r["ratio"] is None else "%.3f" % r["ratio"],
                "" if not ci else " (95%% CI %.3f-%.3f)" % tuple(ci), "" if not errors else "; " + errors[-1]),
                file=sys.stderr)
    finally:
        if workers:
            for w in workers:
                w.close()
    return 0 if ok else 1


def write(out, r):
    with open(os.path.join(out, "pairs_%s.json" % r["row"]), "w") as f:
        f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    sys.exit(main())
