#!/usr/bin/env python3
"""ctest prometheus.dashboard_queries: every query of the vlake Grafana dashboard, run by a real
Prometheus against a real vlaked on the simulator, must return series with the expected labels.

Steps: start vlaked (simulated 1 GiB GPU, a quota file with a namespace + guarantee, the metrics
exporter on a free port); run two tenant processes under the hook that hold memory (one also
gets a grant refused, so denial series exist); `promtool check metrics` on a raw scrape; start
/usr/bin/prometheus scraping the exporter every 1 s with target labels cluster="ci",
node=<hostname>, job="vlake"; wait until the target is up and a few scrapes are in; then run
every target expr of every dashboard panel (template variables replaced by ".*", range
variables by fixed durations) through /api/v1/query and check that the result is non-empty and
every series carries the labels EXPECTED names for that panel, plus cluster/node. Everything
started is killed at the end, on failure too. Exit 0 pass, 1 fail, 77 skip (no prometheus, or
vlaked without --metrics-address yet).

--fake-metrics FILE serves FILE (a hand-written exposition following docs of metrics.md) from a
stdlib HTTP server instead of starting vlaked and tenants: develops/checks the dashboard against
the contract alone. Stdlib only (urllib, json, subprocess).
"""
import argparse
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

MiB = 1 << 20
DEADLINE = time.monotonic() + 55  # the whole test stays under ctest's 60 s
NODE = f"prom-dash-{os.getpid()}"         # VLAKE_SIM_NODE: simulated device capacity of its own
STATE = f"vlake-prom-dash-{os.getpid()}"  # vlaked's state segment

# Panel title -> per refId, the labels every result series must carry (cluster and node are
# required for every query in addition). A panel of the dashboard missing here fails the test,
# so a new panel must state what it expects.
GPU = ["gpu", "gpu_index"]
NS = GPU + ["namespace"]
TENANT = NS + ["tenant"]
EXPECTED = {
    "Namespace usage vs limit (per GPU)": {"A": NS, "B": NS},
    "Namespace usage % of limit": {"A": NS},
    "Tenant usage vs limit (per pod / tenant)": {"A": TENANT, "B": TENANT},
    "Tenant usage breakdown": {"A": TENANT, "B": TENANT, "C": TENANT},
    "Pool free / reserved / granted (per GPU)": {r: GPU for r in "ABCDE"},
    "Pool fragmentation (per GPU)": {"A": GPU, "B": GPU},
    "Guarantees and borrowed memory": {"A": GPU, "B": GPU, "C": NS},
    "Dedup savings (logical − physical)": {"A": GPU, "B": GPU, "C": GPU},
    "Grant latency p50 / p99": {"A": [], "B": []},
    "Grant denials by reason": {"A": ["reason"]},
    "Grant activity": {r: [] for r in "ABCDE"},
    "Guard alarms and kernel faults": {"A": ["kind"], "B": ["guarded", "maps_shared"]},
    "Tenants and sessions": {"A": [], "B": ["state"], "C": ["namespace"]},
    "Config reloads / errors": {"A": [], "B": [], "C": []},
    "Daemon up": {"A": [], "B": ["job", "instance"], "C": []},
    "Daemon info": {"A": ["version", "revision"], "B": [], "C": [], "D": [], "E": []},
}

SUBST = [  # Grafana variables -> values for a query at "now"
    ("$__rate_interval", "30s"), ("${__rate_interval}", "30s"),
    ("$__interval", "5s"), ("${__interval}", "5s"),
    ("$__range", "1m"), ("${__range}", "1m"),
    ('"$cluster"', '".*"'), ('"$node"', '".*"'), ('"$namespace"', '".*"'),
    ('"${cluster}"', '".*"'), ('"${node}"', '".*"'), ('"${namespace}"', '".*"'),
]


class Failure(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def remaining(cap):
    return max(0.5, min(cap, DEADLINE - time.monotonic()))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=3.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def wait_for(what, fn, timeout):
    end = time.monotonic() + remaining(timeout)
    last = None
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
        except (OSError, urllib.error.URLError, ValueError) as e:
            last = e
        time.sleep(0.2)
    raise Failure(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))


class Procs:
    """Every process started, killed (process group) at the end."""

    def __init__(self):
        self.procs = []

    def start(self, name, args, **kw):
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(args, start_new_session=True, **kw)
        self.procs.append((name, p))
        return p

    def check_alive(self):
        for name, p in self.procs:
            if p.poll() is not None:
                raise Failure(f"{name} exited early with status {p.returncode}")

    def kill_all(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + 3
        for _, p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def serve_fake(path, port):
    body = open(path, "rb").read()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/metrics":
                data, ctype = body, "text/plain; version=0.0.4; charset=utf-8"
            elif self.path == "/healthz":
                data, ctype = b"ok\n", "text/plain"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def read_steps(proc, name, wanted, timeout):
    """Reads the tenant's step lines until every step in `wanted` has reported; returns
    {step: line}."""
    got = {}
    end = time.monotonic() + remaining(timeout)
    buf = b""
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    while any(w not in got for w in wanted):
        if time.monotonic() > end:
            raise Failure(f"tenant {name}: no output for {wanted} (got {got}, partial {buf!r})")
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            raise Failure(f"tenant {name} exited (status {proc.wait()}) before {wanted}: {got}")
        if chunk:
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                step = text.split(" ", 1)[0]
                got.setdefault(step, text)
        else:
            time.sleep(0.05)
    return got


def rc_of(line):
    m = re.search(r"\brc=(-?\d+)", line)
    return int(m.group(1)) if m else None


def start_daemon_and_tenants(a, procs, tmp, metrics_port):
    help_out = subprocess.run([a.vlaked, "--help"], capture_output=True, text=True, timeout=10)
    if "--metrics-address" not in help_out.stdout + help_out.stderr:
        log(f"SKIP: {a.vlaked} does not accept --metrics-address yet (exporter not built in)")
        sys.exit(77)
    node = NODE
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VLAKE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update({"VLAKE_SIM_NODE": node, "VLAKE_SIM_DEVICE_MEMORY": "1GiB", "VLAKE_SIM_DEVICE_COUNT": "1"})
    sock = os.path.join(tmp, "vlaked.sock")
    config = os.path.join(tmp, "vlake.yaml")
    with open(config, "w") as f:
        f.write("version: 1\n"
                "default:\n  limit: 512MiB\n"
                "namespaces:\n"
                "  - name: research\n    limit: 768MiB\n    guaranteed: 256MiB\n    users: [4242]\n"
                "users:\n  - uid: 4243\n    limit: 96MiB\n")
    daemon_log = open(os.path.join(tmp, "vlaked.log"), "w")
    procs.start("vlaked", [a.vlaked, "--driver", a.sim, "--nvml", "none", "--socket", sock,
                           "--state", STATE, "--config", config,
                           "--metrics-address", f"127.0.0.1:{metrics_port}",
                           "--sample-interval-ms", "200"],
                env=env, stdout=daemon_log, stderr=subprocess.STDOUT,
                umask=0o002)  # the simulator's node file stays group-writable for the tenants
    try:
        wait_for("vlaked /healthz", lambda: procs.check_alive() or
                 http_get(f"http://127.0.0.1:{metrics_port}/healthz")[0] == 200, 10)
        wait_for("vlaked socket", lambda: os.path.exists(sock), 5)
    except Failure:
        daemon_log.flush()
        log(open(daemon_log.name).read()[-3000:])
        raise

    asan_options = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
    tenv = dict(env, LD_PRELOAD=a.hook, LD_LIBRARY_PATH=os.path.dirname(a.sim), VLAKE_SOCKET=sock,
                ASAN_OPTIONS=asan_options)
    tenants = [
        # research/user:4242: 64 MiB inside its namespace's guarantee
        ("research", 4242, ["init", "alloc:a:64M", "sleep:60000"], ["init", "alloc:a:64M"]),
        # user:4243 (namespace default, limit 96 MiB): 64 MiB, then 64 MiB more is refused
        ("default", 4243, ["init", "alloc:a:64M", "alloc:b:64M", "sleep:60000"],
         ["init", "alloc:a:64M", "alloc:b:64M"]),
    ]
    for name, uid, steps, wanted in tenants:
        p = procs.start(f"tenant {name}", [a.tenant] + steps, env=tenv, stdout=subprocess.PIPE,
                        stderr=open(os.path.join(tmp, f"tenant-{name}.err"), "w"),
                        user=uid, group=0, extra_groups=[])
        got = read_steps(p, name, wanted, 10)
        log(f"tenant {name}: " + " | ".join(got[w] for w in wanted))
        for step in ("init", "alloc:a:64M"):
            if rc_of(got[step]) != 0:
                raise Failure(f"tenant {name}: {step} failed: {got[step]}")
        if "alloc:b:64M" in wanted and rc_of(got["alloc:b:64M"]) in (0, None):
            raise Failure(f"tenant {name}: alloc:b over the 96 MiB limit was not refused: {got['alloc:b:64M']}")
    return {"research/user:4242": 64 * MiB, "user:4243": 64 * MiB}


def check_scrape(a, metrics_port, tmp):
    status, text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    if status != 200:
        raise Failure(f"/metrics answered {status}")
    with open(os.path.join(tmp, "scrape.txt"), "w") as f:
        f.write(text)
    r = subprocess.run([a.promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=10)
    if r.returncode != 0:
        raise Failure(f"promtool check metrics failed:\n{r.stdout}{r.stderr}")
    log("promtool check metrics: OK")
    return text


def query(prom, expr):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        _, body = http_get(url, timeout=5)
    except urllib.error.HTTPError as e:
        raise Failure(f"query failed ({e.code}): {expr}\n{e.read().decode('utf-8', 'replace')}")
    doc = json.loads(body)
    if doc.get("status") != "success":
        raise Failure(f"query failed: {expr}: {doc}")
    return doc["data"]


def substitute(expr):
    for k, v in SUBST:
        expr = expr.replace(k, v)
    if "$" in expr:
        raise Failure(f"unsubstituted variable in: {expr}")
    return expr


def panels_of(dash):
    for p in dash["panels"]:
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--vlaked")
    ap.add_argument("--sim")
    ap.add_argument("--hook")
    ap.add_argument("--tenant")
    ap.add_argument("--prometheus", default="/usr/bin/prometheus")
    ap.add_argument("--promtool", default="/usr/bin/promtool")
    ap.add_argument("--fake-metrics")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    a = ap.parse_args()

    for tool in (a.prometheus, a.promtool):
        if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
            log(f"SKIP: {tool} not installed (Debian package 'prometheus')")
            return 77
    if not a.fake_metrics and not all((a.vlaked, a.sim, a.hook, a.tenant)):
        ap.error("--vlaked, --sim, --hook and --tenant are required without --fake-metrics")
    with open(a.dashboard) as f:
        dash = json.load(f)

    tmp = tempfile.mkdtemp(prefix="vlake-prom-dash-")
    os.chmod(tmp, 0o755)  # tenants run as other uids
    procs = Procs()
    fake = None
    try:
        metrics_port = free_port()
        if a.fake_metrics:
            fake = serve_fake(a.fake_metrics, metrics_port)
            held = {}
        else:
            held = start_daemon_and_tenants(a, procs, tmp, metrics_port)
        scrape = check_scrape(a, metrics_port, tmp)

        host = socket.gethostname()
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        cfg = os.path.join(tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: vlake\n    scrape_interval: 1s\n"
                    "    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{metrics_port}']\n"
                    f"        labels: {{cluster: ci, node: {json.dumps(host)}}}\n")
        procs.start("prometheus", [a.prometheus, f"--config.file={cfg}",
                                   f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}",
                                   "--log.level=warn"],
                    stdout=open(os.path.join(tmp, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
        wait_for("prometheus ready", lambda: procs.check_alive() or
                 http_get(f"{prom}/-/ready")[0] == 200, 15)

        def target_up():
            _, body = http_get(f"{prom}/api/v1/targets?state=active")
            ts = json.loads(body)["data"]["activeTargets"]
            return any(t["health"] == "up" and t["labels"].get("job") == "vlake" for t in ts)
        wait_for("the vlake target up", target_up, 15)
        # a few scrapes in: rate() over 30 s needs two samples
        wait_for("4 scrapes", lambda: (query(prom, 'count_over_time(up{job="vlake"}[1m])')["result"] or
                                       [{"value": [0, "0"]}])[0]["value"][1] not in ("0", "1", "2", "3"), 15)
        procs.check_alive()

        # every query of every panel
        failures = []
        checked = 0
        titles = set()
        for p in panels_of(dash):
            title = p.get("title", "")
            titles.add(title)
            if title not in EXPECTED:
                failures.append(f"panel '{title}' has no expectation in EXPECTED (dashboard_queries.py)")
                continue
            targets = p.get("targets", [])
            if not targets:
                failures.append(f"panel '{title}' has no targets")
            for t in targets:
                ref = t.get("refId")
                if ref not in EXPECTED[title]:
                    failures.append(f"panel '{title}' target {ref}: no expectation")
                    continue
                expr = substitute(t["expr"])
                try:
                    data = query(prom, expr)
                except Failure as e:
                    failures.append(f"panel '{title}' target {ref}: {e}")
                    continue
                res = data["result"] if data["resultType"] == "vector" else []
                checked += 1
                if not res:
                    failures.append(f"panel '{title}' target {ref}: empty result for {expr}")
                    continue
                need = ["cluster", "node"] + EXPECTED[title][ref]
                for s in res:
                    missing = [l for l in need if l not in s["metric"]]
                    if missing:
                        failures.append(f"panel '{title}' target {ref}: series {s['metric']} lacks {missing} ({expr})")
                        break
                    if s["metric"]["cluster"] != "ci" or s["metric"]["node"] != host:
                        failures.append(f"panel '{title}' target {ref}: wrong cluster/node in {s['metric']}")
                        break
        for title in EXPECTED:
            if title not in titles:
                failures.append(f"EXPECTED names panel '{title}' that the dashboard lacks")

        # the values behind the panels match what the tenants did
        if held:
            for tenant, size in held.items():
                r = query(prom, f'vlake_tenant_used_bytes{{tenant="{tenant}", gpu_index="0"}}')["result"]
                if not r or int(float(r[0]["value"][1])) < size:
                    failures.append(f"vlake_tenant_used_bytes of {tenant}: {r} (expected >= {size})")
            r = query(prom, 'vlake_namespace_guaranteed_bytes{namespace="research", gpu_index="0"}')["result"]
            if not r or int(float(r[0]["value"][1])) != 256 * MiB:
                failures.append(f"research's guarantee: {r} (expected {256 * MiB})")
            r = query(prom, 'vlake_grant_denials_total{reason="tenant_limit"}')["result"]
            if not r or float(r[0]["value"][1]) < 1:
                failures.append(f"no tenant_limit denial counted: {r}")
            r = query(prom, 'vlake_daemon_up')["result"]
            if not r or r[0]["value"][1] != "1":
                failures.append(f"vlake_daemon_up: {r}")

        log(f"{checked} dashboard queries run")
        if failures:
            for f in failures:
                log("FAIL: " + f)
            log(f"(temp files: {tmp})")
            a.keep = True
            return 1
        log("OK: every dashboard query returns series with the expected labels")
        return 0
    except Failure as e:
        log(f"FAIL: {e}")
        for name in ("vlaked.log", "prometheus.log", "tenant-research.err", "tenant-default.err"):
            path = os.path.join(tmp, name)
            if os.path.exists(path):
                log(f"--- {name} (tail)\n" + open(path, errors="replace").read()[-2000:])
        a.keep = True
        return 1
    finally:
        procs.kill_all()
        for shm in (STATE, "vlake-sim-" + NODE):  # the segments this run created
            try:
                os.unlink("/dev/shm/" + shm)
            except FileNotFoundError:
                pass
        if fake:
            fake.shutdown()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
