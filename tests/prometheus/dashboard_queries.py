#!/usr/bin/env python3
"""ctest prometheus.dashboard_queries and prometheus.operator_scrape: every query of the vlake
Grafana dashboard and the alert rules, run by a real Prometheus against a real vlaked on the
simulator, must return series with the expected labels and values.

Steps: start vlaked (simulated 1 GiB GPU, a quota file with a namespace near its limit and a
guarantee, the metrics exporter on a free port); start /usr/bin/prometheus scraping it every
1 s and evaluating the alert rules every 1 s; wait for a few scrapes; then run two tenant
processes under the hook that hold memory (one also gets a grant refused, so denials rise while
Prometheus watches); `promtool check metrics` on a raw scrape; lower one tenant's limit below
what it holds (a quota reload), so it is over its limit. Then:
- every target expr of every dashboard panel (template variables replaced by ".*", range
  variables by fixed durations) through /api/v1/query: the result is non-empty and every series
  carries the labels EXPECTED names for that panel, plus cluster/node; the queries of a table
  that merges them return the same label sets (one row per key); every selector of a metric
  with a `gpu` label filters gpu=~"$gpu"; the tenant panels with $namespace set to one
  namespace return only that namespace's series;
- the dashboard's variables (label values of their queries): the namespace variable lists the
  tenants' namespaces (and, under the operator's relabeling, not vlake's own namespace);
- the alerts: VlakeNamespaceNearLimit, VlakeTenantOverLimit and VlakeSustainedDenials are
  pending (their `for` has not passed) with the tenant's namespace in tenant_namespace and in
  their description; VlakeExporterDown's selector matches the scrape job; the health alerts are
  not active.

--mode static (prometheus.dashboard_queries): the scrape config of docs/dashboards.md, target
labels cluster="ci", node=<hostname>, job "vlake"; rules from alerts/vlake-alerts.yaml.
--mode operator (prometheus.operator_scrape): the scrape config the Prometheus Operator generates
for the chart's ServiceMonitor, rendered by `helm template` (honorLabels, jobLabel, the chart's
relabelings, the operator's own relabelings setting namespace/pod/container/service/endpoint/job
from the Kubernetes service discovery labels, here given as static target labels of a pod in
namespace vlake-system); rules from the rendered PrometheusRule. Checks in addition that series
carry the target labels of vlaked's pod (namespace="vlake-system") next to vlaked's
tenant_namespace, and that no series has an exported_* label. Needs helm and node with the yaml
package (tools/k8s, scripts/setup.sh); exit 77 without them.

Everything started is killed at the end, on failure too. Exit 0 pass, 1 fail, 77 skip (no
prometheus, or vlaked without --metrics-address yet).

--fake-metrics FILE serves FILE (a hand-written exposition following docs/metrics.md) from a
stdlib HTTP server instead of starting vlaked and tenants: develops/checks the dashboard against
the contract alone (values, variables and alerts are not checked). Stdlib only (urllib, json,
subprocess).
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
DEADLINE = time.monotonic() + 80  # the whole test stays under ctest's 90 s
NODE = f"prom-dash-{os.getpid()}"         # VLAKE_SIM_NODE: simulated device capacity of its own
STATE = f"vlake-prom-dash-{os.getpid()}"  # vlaked's state segment
RELEASE_NAMESPACE = "vlake-system"         # operator mode: where the chart is "installed"
POD = "vlake-x7k2p"                        # operator mode: vlaked's pod, as service discovery names it

# Panel title -> per refId, the labels every result series must carry (cluster and node are
# required for every query in addition). A panel of the dashboard missing here fails the test,
# so a new panel must state what it expects. (tenant_pod and tenant_container are "" for host
# tenants, and Prometheus drops empty labels: not required.)
GPU = ["gpu", "gpu_index"]
NS = GPU + ["tenant_namespace"]
TENANT = NS + ["tenant"]
INFO = ["version", "revision"]
EXPECTED = {
    "Namespace usage vs limit (per GPU)": {"A": NS, "B": NS},
    "Namespace usage % of limit": {"A": NS},
    "Tenant usage vs limit (per pod / tenant)": {"A": TENANT, "B": TENANT},
    "Tenant usage breakdown": {r: TENANT for r in "ABCDEF"},
    "Top 10 tenants by GPU memory": {r: TENANT for r in "ABC"},
    "Pool free / reserved / granted (per GPU)": {r: GPU for r in "ABCDE"},
    "Pool fragmentation (per GPU)": {"A": GPU, "B": GPU},
    "Guarantees and borrowed memory": {"A": GPU, "B": GPU, "C": NS},
    "Dedup savings (logical − physical)": {"A": GPU, "B": GPU, "C": GPU},
    "Grant latency p50 / p99": {"A": [], "B": []},
    "Grant denials by reason": {"A": ["reason"]},
    "Grant activity": {r: [] for r in "ABCDE"},
    "Guard alarms and kernel faults": {"A": ["kind"], "B": ["guarded", "maps_shared"]},
    "Tenants and sessions": {"A": [], "B": ["state"], "C": ["tenant_namespace"]},
    "Config reloads / errors": {"A": [], "B": [], "C": []},
    "Daemon up": {"A": [], "B": ["job", "instance"], "C": []},
    "Daemon info": {r: INFO for r in "ABCD"},
}
# Panels whose series must all belong to the namespace $namespace is set to.
NAMESPACE_FILTERED = ["Tenant usage vs limit (per pod / tenant)", "Tenant usage breakdown",
                      "Top 10 tenants by GPU memory", "Namespace usage vs limit (per GPU)"]

SUBST = [  # Grafana variables -> values for a query at "now"
    ("$__rate_interval", "30s"), ("${__rate_interval}", "30s"),
    ("$__interval", "5s"), ("${__interval}", "5s"),
    ("$__range", "1m"), ("${__range}", "1m"),
]
VARIABLES = ("cluster", "node", "gpu", "namespace", "pod")

# The quota file: research holds 64 MiB of its 68 MiB (94%: VlakeNamespaceNearLimit pending);
# user:4243 (namespace default) holds 64 MiB of 96 MiB and is refused 64 MiB more (a
# tenant_limit denial: VlakeSustainedDenials pending); then its limit is lowered to 32 MiB
# (over its limit: VlakeTenantOverLimit pending).
QUOTA = ("version: 1\n"
         "default:\n  limit: 512MiB\n"
         "namespaces:\n"
         "  - name: research\n    limit: 68MiB\n    guaranteed: 32MiB\n    users: [4242]\n"
         "users:\n  - uid: 4243\n    limit: {limit}\n")


class Failure(Exception):
    pass


class Skip(Exception):
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
        except (OSError, urllib.error.URLError, ValueError, Failure) as e:
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


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def tenant_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith("VLAKE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}


def start_daemon(a, procs, tmp, metrics_port):
    help_out = subprocess.run([a.vlaked, "--help"], capture_output=True, text=True, timeout=10)
    if "--metrics-address" not in help_out.stdout + help_out.stderr:
        raise Skip(f"{a.vlaked} does not accept --metrics-address yet (exporter not built in)")
    env = tenant_env()
    env.update({"VLAKE_SIM_NODE": NODE, "VLAKE_SIM_DEVICE_MEMORY": "1GiB", "VLAKE_SIM_DEVICE_COUNT": "1"})
    sock = os.path.join(tmp, "vlaked.sock")
    config = os.path.join(tmp, "vlake.yaml")
    write_atomic(config, QUOTA.format(limit="96MiB"))
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
    return {"env": env, "sock": sock, "config": config}


def start_tenants(a, procs, tmp, daemon):
    env = daemon["env"]
    asan_options = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
    tenv = dict(env, LD_PRELOAD=a.hook, LD_LIBRARY_PATH=os.path.dirname(a.sim), VLAKE_SOCKET=daemon["sock"],
                ASAN_OPTIONS=asan_options)
    tenants = [
        # research/user:4242: 64 MiB inside its namespace's 68 MiB
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


# --- the Prometheus Operator's scrape config for the chart's ServiceMonitor ----------------------

def helm_objects(a, tmp, args):
    """`helm template` of the chart with `args`, as a list of objects (JSON through node's yaml)."""
    env = dict(os.environ, HELM_CACHE_HOME=os.path.join(tmp, "helm", "cache"),
               HELM_CONFIG_HOME=os.path.join(tmp, "helm", "config"), HELM_DATA_HOME=os.path.join(tmp, "helm", "data"))
    r = subprocess.run([a.helm, "template", "vlake", a.chart, "--namespace", RELEASE_NAMESPACE] + args,
                       capture_output=True, text=True, env=env, timeout=60)
    if r.returncode != 0:
        raise Failure(f"helm template failed:\n{r.stderr}")
    conv = ("const Y=require(process.argv[1]);let s='';process.stdin.on('data',d=>s+=d).on('end',()=>"
            "process.stdout.write(JSON.stringify(Y.parseAllDocuments(s).map(d=>d.toJS()).filter(o=>o))))")
    j = subprocess.run([a.node, "-e", conv, os.path.join(a.tools, "node_modules", "yaml")], input=r.stdout,
                       capture_output=True, text=True, timeout=60)
    if j.returncode != 0:
        raise Failure(f"YAML to JSON (node) failed:\n{j.stderr}")
    return json.loads(j.stdout)


def one(objs, kind):
    found = [o for o in objs if o.get("kind") == kind]
    if len(found) != 1:
        raise Failure(f"helm template rendered {len(found)} {kind} objects, not 1")
    return found[0]


def sanitize(name):
    """A Kubernetes label name as service discovery turns it into a meta label suffix."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


RELABEL_KEYS = {"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
                "regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action"}


def operator_job(objs, address, node_name):
    """The scrape job the Prometheus Operator generates for the ServiceMonitor's first endpoint
    (role endpoints), with kubernetes_sd's discovery of vlaked's pod given as static target
    labels: the operator's own relabelings (keep the selected Service and port; namespace, pod,
    container, service, job, endpoint target labels), then the endpoint's relabelings."""
    sm, svc, ds = one(objs, "ServiceMonitor"), one(objs, "Service"), one(objs, "DaemonSet")
    ep = sm["spec"]["endpoints"][0]
    container = next(c["name"] for c in ds["spec"]["template"]["spec"]["containers"]
                     if any(p.get("name") == ep["port"] for p in c.get("ports", [])))
    meta = {
        "__meta_kubernetes_namespace": svc["metadata"]["namespace"],
        "__meta_kubernetes_service_name": svc["metadata"]["name"],
        "__meta_kubernetes_endpoint_port_name": ep["port"],
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": POD,
        "__meta_kubernetes_pod_name": POD,
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_pod_node_name": node_name,
        "__meta_kubernetes_pod_phase": "Running",
    }
    for k, v in svc["metadata"].get("labels", {}).items():
        meta[f"__meta_kubernetes_service_label_{sanitize(k)}"] = v
        meta[f"__meta_kubernetes_service_labelpresent_{sanitize(k)}"] = "true"
    for k, v in ds["spec"]["template"]["metadata"].get("labels", {}).items():
        meta[f"__meta_kubernetes_pod_label_{sanitize(k)}"] = v
    target_sel = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    relabel = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for k, v in sm["spec"]["selector"]["matchLabels"].items():
        relabel.append({"action": "keep", "source_labels": [f"__meta_kubernetes_service_label_{sanitize(k)}",
                                                            f"__meta_kubernetes_service_labelpresent_{sanitize(k)}"],
                        "regex": f"({v});true"})
    relabel += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"]},
        {"source_labels": target_sel, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
        {"source_labels": target_sel, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
    ]
    if sm["spec"].get("jobLabel"):
        relabel.append({"source_labels": [f"__meta_kubernetes_service_label_{sanitize(sm['spec']['jobLabel'])}"],
                        "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
    relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
    for r in ep.get("relabelings", []):
        unknown = set(r) - set(RELABEL_KEYS)
        if unknown:
            raise Failure(f"ServiceMonitor relabeling with keys this test does not translate: {unknown}")
        c = {RELABEL_KEYS[k]: v for k, v in r.items()}
        if "action" in c:
            c["action"] = c["action"].lower()
        relabel.append(c)
    return {
        "job_name": f"serviceMonitor/{sm['metadata']['namespace']}/{sm['metadata']['name']}/0",
        "honor_labels": bool(ep.get("honorLabels", False)),
        "honor_timestamps": True,
        "scrape_interval": ep.get("interval", "30s"),
        "scrape_timeout": ep.get("scrapeTimeout", "10s"),
        "metrics_path": ep.get("path", "/metrics"),
        "scheme": "http",
        "static_configs": [{"targets": [address], "labels": meta}],
        "relabel_configs": relabel,
    }


def operator_setup(a, tmp, metrics_port, host):
    """Renders the chart as an operator user installs it and returns (scrape job, rules file)."""
    objs = helm_objects(a, tmp, [
        "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
        "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
        "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.cluster=ci",
        "--set", "serviceMonitor.interval=1s", "--set", "serviceMonitor.scrapeTimeout=1s",
        "--set", "prometheusRule.enabled=true"])
    job = operator_job(objs, f"127.0.0.1:{metrics_port}", host)
    rules = os.path.join(tmp, "rules.json")
    with open(rules, "w") as f:
        json.dump(one(objs, "PrometheusRule")["spec"], f)
    log(f"operator mode: job {job['job_name']}, honor_labels {job['honor_labels']}, "
        f"{len(job['relabel_configs'])} relabelings")
    return job, rules


def static_setup(a, metrics_port, host):
    job = {"job_name": "vlake", "scrape_interval": "1s", "scrape_timeout": "1s",
           "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"], "labels": {"cluster": "ci", "node": host}}]}
    return job, a.rules


# --- queries ------------------------------------------------------------------------------------

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


def value(prom, expr):
    r = query(prom, expr)["result"]
    return float(r[0]["value"][1]) if r else None


def label_values(prom, label, selector):
    url = f"{prom}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
    _, body = http_get(url, timeout=5)
    return sorted(json.loads(body)["data"])


def substitute(expr, values=None):
    for k, v in SUBST:
        expr = expr.replace(k, v)
    for var in VARIABLES:
        v = (values or {}).get(var, ".*")
        expr = expr.replace(f'"${var}"', f'"{v}"').replace(f'"${{{var}}}"', f'"{v}"')
    if "$" in expr:
        raise Failure(f"unsubstituted variable in: {expr}")
    return expr


def panels_of(dash):
    for p in dash["panels"]:
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def selectors(expr):
    return re.findall(r"\b(vlake_\w+|up)\s*(\{[^}]*\})?", expr)


def check_panels(prom, dash, host, failures):
    checked = 0
    titles = set()
    gpu_metrics = {s["metric"]["__name__"] for s in
                   query(prom, 'group by (__name__) ({__name__=~"vlake_.+", gpu!=""})')["result"]}
    if not gpu_metrics:
        failures.append("no vlake series with a gpu label")
    for p in panels_of(dash):
        title = p.get("title", "")
        titles.add(title)
        if title not in EXPECTED:
            failures.append(f"panel '{title}' has no expectation in EXPECTED (dashboard_queries.py)")
            continue
        targets = p.get("targets", [])
        if not targets:
            failures.append(f"panel '{title}' has no targets")
        merged = {}
        for t in targets:
            ref = t.get("refId")
            if ref not in EXPECTED[title]:
                failures.append(f"panel '{title}' target {ref}: no expectation")
                continue
            for metric, matchers in selectors(t["expr"]):
                if metric in gpu_metrics and 'gpu=~"$gpu"' not in (matchers or ""):
                    failures.append(f"panel '{title}' target {ref}: {metric} has a gpu label; {matchers} lacks gpu=~\"$gpu\"")
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
            merged[ref] = sorted(json.dumps({k: v for k, v in s["metric"].items() if k != "__name__"}, sort_keys=True)
                                 for s in res)
        steps = [x.get("id") for x in p.get("transformations", [])]
        if "merge" in steps and len(set(json.dumps(v) for v in merged.values())) > 1:
            failures.append(f"table '{title}': its queries return different label sets, the merge would not give "
                            f"one row per key: {merged}")
    for title in EXPECTED:
        if title not in titles:
            failures.append(f"EXPECTED names panel '{title}' that the dashboard lacks")
    return checked


def check_namespace_filter(prom, dash, failures):
    """With $namespace = research, the tenant panels show research's series only."""
    for p in panels_of(dash):
        if p.get("title") not in NAMESPACE_FILTERED:
            continue
        for t in p["targets"]:
            res = query(prom, substitute(t["expr"], {"namespace": "research"}))["result"]
            spaces = {s["metric"].get("tenant_namespace") for s in res}
            if spaces != {"research"}:
                failures.append(f"panel '{p['title']}' target {t['refId']} with namespace=research: "
                                f"tenant_namespace values {spaces}")


def check_variables(prom, dash, operator, failures):
    vars_ = {v["name"]: v for v in dash["templating"]["list"]}
    got = {}
    for name in VARIABLES:
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", vars_[name]["definition"])
        selector, label = m.group(1), m.group(2)
        got[name] = label_values(prom, label, substitute(selector))
    log(f"dashboard variables: {got}")
    if "research" not in got["namespace"] or "default" not in got["namespace"]:
        failures.append(f"namespace variable {got['namespace']} lacks the tenants' namespaces research, default")
    if operator and RELEASE_NAMESPACE in got["namespace"]:
        failures.append(f"namespace variable lists vlake's own namespace {RELEASE_NAMESPACE}: {got['namespace']}")
    if got["cluster"] != ["ci"] or len(got["node"]) != 1 or len(got["gpu"]) != 1:
        failures.append(f"cluster/node/gpu variables: {got}")


def pending_alerts(prom):
    _, body = http_get(f"{prom}/api/v1/alerts")
    return json.loads(body)["data"]["alerts"]


def check_alerts(prom, operator, failures):
    want = {  # alert -> labels it must carry, words its description must name
        "VlakeNamespaceNearLimit": ({"tenant_namespace": "research"}, ["Namespace research "]),
        "VlakeTenantOverLimit": ({"tenant": "user:4243", "tenant_namespace": "default"}, ["(namespace default)"]),
        "VlakeSustainedDenials": ({"reason": "tenant_limit"}, ["reason tenant_limit"]),
    }

    def all_there():
        names = {x["labels"]["alertname"] for x in pending_alerts(prom)}
        return set(want) <= names
    try:
        wait_for("the alerts " + ", ".join(want), all_there, 15)
    except Failure:
        pass  # reported below, alert by alert
    alerts = pending_alerts(prom)
    for name, (labels, words) in want.items():
        found = [x for x in alerts if x["labels"]["alertname"] == name and
                 all(x["labels"].get(k) == v for k, v in labels.items())]
        if not found:
            failures.append(f"alert {name} with {labels} not active; active: {[x['labels'] for x in alerts]}")
            continue
        x = found[0]
        desc = x["annotations"].get("description", "")
        for w in words:
            if w not in desc:
                failures.append(f"alert {name}: description {desc!r} lacks {w!r}")
        if operator and name != "VlakeSustainedDenials":
            if x["labels"].get("namespace") != RELEASE_NAMESPACE:
                failures.append(f"alert {name}: namespace (the target's) is {x['labels'].get('namespace')}, "
                                f"not {RELEASE_NAMESPACE}")
            if RELEASE_NAMESPACE in desc:
                failures.append(f"alert {name}: description names vlake's own namespace: {desc!r}")
        log(f"alert {name} {x['state']}: {desc}")
    for name in ("VlakeDaemonDown", "VlakeConfigRejected", "VlakeExporterDown", "VlakeGuardViolation"):
        if any(x["labels"]["alertname"] == name for x in alerts):
            failures.append(f"alert {name} is active: {[x for x in alerts if x['labels']['alertname'] == name]}")
    # VlakeExporterDown's selector (up{job=~".*vlake.*"}) must match the scrape job.
    if not query(prom, 'up{job=~".*vlake.*"} == 1')["result"]:
        failures.append("VlakeExporterDown's selector up{job=~\".*vlake.*\"} matches no scrape job")


def check_operator_labels(prom, host, failures):
    r = query(prom, 'vlake_tenant_used_bytes{tenant="research/user:4242"}')["result"]
    want = {"namespace": RELEASE_NAMESPACE, "pod": POD, "container": "vlaked", "endpoint": "metrics",
            "job": "vlake", "cluster": "ci", "node": host, "tenant_namespace": "research"}
    if not r:
        failures.append("operator mode: no vlake_tenant_used_bytes of research/user:4242")
    for s in r:
        wrong = {k: s["metric"].get(k) for k, v in want.items() if s["metric"].get(k) != v}
        if wrong or "service" not in s["metric"]:
            failures.append(f"operator mode: series {s['metric']}: wrong labels {wrong} (want {want} and a service)")
    for label in ("exported_namespace", "exported_pod", "exported_container", "exported_job", "exported_instance"):
        r = query(prom, f'count by (__name__) ({{__name__=~".+", {label}!=""}})')["result"]
        if r:
            failures.append(f"operator mode: series with {label}: {[s['metric'] for s in r]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--mode", choices=("static", "operator"), default="static")
    ap.add_argument("--rules", help="static mode: the alert rules file")
    ap.add_argument("--chart", help="operator mode: the chart directory")
    ap.add_argument("--helm", help="operator mode: helm")
    ap.add_argument("--node", help="operator mode: node (with --tools DIR/node_modules/yaml)")
    ap.add_argument("--tools", help="operator mode: tools/k8s")
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
    operator = a.mode == "operator"
    if operator:
        if not (a.chart and a.tools):
            ap.error("--chart and --tools are required with --mode operator")
        missing = [p for p in (a.helm, a.node, os.path.join(a.tools, "node_modules", "yaml"))
                   if not p or not os.path.exists(p)]
        if missing:
            log(f"SKIP: not installed: {missing} (scripts/setup.sh installs node and tools/k8s)")
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
        daemon = None
        if a.fake_metrics:
            fake = serve_fake(a.fake_metrics, metrics_port)
        else:
            daemon = start_daemon(a, procs, tmp, metrics_port)

        host = socket.gethostname()
        job, rules = operator_setup(a, tmp, metrics_port, host) if operator else static_setup(a, metrics_port, host)
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        cfg = os.path.join(tmp, "prometheus.yml")
        with open(cfg, "w") as f:  # JSON is YAML
            json.dump({"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                       "rule_files": [rules] if rules and daemon else [],
                       "scrape_configs": [job]}, f, indent=1)
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
        wait_for("the vlake target up (job \"vlake\")", target_up, 15)

        def scrapes(n):
            return lambda: (value(prom, 'count_over_time(up{job="vlake"}[1m])') or 0) >= n
        wait_for("2 scrapes", scrapes(2), 10)  # the counters' values before the tenants act
        held = {}
        if daemon:
            held = start_tenants(a, procs, tmp, daemon)
        check_scrape(a, metrics_port, tmp)
        wait_for("2 more scrapes", scrapes(4), 10)  # rate() over 30 s needs two samples
        if daemon:
            # Lower user:4243's limit below what it holds: over its limit after the reload.
            write_atomic(daemon["config"], QUOTA.format(limit="32MiB"))
            wait_for("user:4243 over its lowered limit in Prometheus",
                     lambda: value(prom, 'vlake_tenant_over_limit{tenant="user:4243"} == 1'), 15)
        procs.check_alive()

        failures = []
        checked = check_panels(prom, dash, host, failures)
        if daemon:
            for tenant, size in held.items():
                v = value(prom, f'vlake_tenant_used_bytes{{tenant="{tenant}", gpu_index="0"}}')
                if v is None or v < size:
                    failures.append(f"vlake_tenant_used_bytes of {tenant}: {v} (expected >= {size})")
            v = value(prom, 'vlake_namespace_guaranteed_bytes{tenant_namespace="research", gpu_index="0"}')
            if v != 32 * MiB:
                failures.append(f"research's guarantee: {v} (expected {32 * MiB})")
            v = value(prom, 'vlake_grant_denials_total{reason="tenant_limit"}')
            if v is None or v < 1:
                failures.append(f"no tenant_limit denial counted: {v}")
            if value(prom, 'vlake_daemon_up') != 1:
                failures.append("vlake_daemon_up is not 1")
            check_namespace_filter(prom, dash, failures)
            check_variables(prom, dash, operator, failures)
            check_alerts(prom, operator, failures)
            if operator:
                check_operator_labels(prom, host, failures)

        log(f"{checked} dashboard queries run")
        if failures:
            for f in failures:
                log("FAIL: " + f)
            log(f"(temp files: {tmp})")
            a.keep = True
            return 1
        log("OK: every dashboard query returns series with the expected labels" +
            ("; alerts and variables name the tenants' namespaces" if daemon else ""))
        return 0
    except Skip as e:
        log(f"SKIP: {e}")
        return 77
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
        # the state segment (contracts/state.hpp segment_path) and simulated node this run created
        state_dir = os.environ.get("VLAKE_STATE_DIR") or "/run/vlake/state"
        for path in (os.path.join(state_dir, STATE), "/dev/shm/vlake-sim-" + NODE):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if fake:
            fake.shutdown()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
