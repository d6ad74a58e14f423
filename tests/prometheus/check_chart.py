#!/usr/bin/env python3
"""ctest prometheus.chart: the Helm chart's monitoring pieces are consistent (no Helm needed).

- templates/prometheusrule.yaml, rendered the way Helm renders it (the `.Files.Get` of
  alerts/vlake-alerts.yaml under `spec:`), carries exactly the plain rules file: one source.
  The rendered `spec` passes `promtool check rules`.
- templates/grafana-dashboard.yaml renders to a ConfigMap labelled grafana_dashboard: "1" whose
  vlake.json is dashboards/vlake.json; both templates are guarded by their values toggle (the
  PrometheusRule also by the cluster serving the kind: .Capabilities).
- dashboards/vlake.json: schemaVersion 39; variables datasource (prometheus), cluster, node, gpu,
  namespace, pod (label_values of the labels below, includeAll + multi); unique panel ids; every
  target has an expr, and every metric selector in it filters cluster=~"$cluster",
  node=~"$node", tenant_namespace=~"$namespace" for tenant/namespace metrics and
  tenant_pod=~"$pod" for tenant metrics; no query, legend or alert uses the labels namespace,
  pod or container, which are the Prometheus Operator's target labels (vlaked's own pod), not
  vlaked's; a table of several queries merges them into one (Grafana shows one frame at a
  time otherwise), as instant table queries; an over-limit flag is shown as a state, not in
  bytes.
Stdlib only. Exit 0 pass, 1 fail, 77 when promtool is missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

TARGET_LABELS = ("namespace", "pod", "container")  # set by the Prometheus Operator on the target
GUARD = re.compile(r'\{\{-\s*if\s+(?:and\s+)?(\.Values\.[\w.]+)(?:\s+\(include "vlake\.hasMonitoringKind" '
                   r'\(dict "root" \. "kind" "(\w+)"\)\))?\s*\}\}')
LABELS = re.compile(r'^[ \t]*\{\{-\s*include "vlake\.labels" \.\s*\|\s*nindent\s+(?P<n>\d+)\s*\}\}[ \t]*$')
FILES_GET = re.compile(r'^(?P<lead>[ \t]*)\{\{-\s*\.Files\.Get\s+"(?P<path>[^"]+)"\s*\|\s*nindent\s+(?P<n>\d+)\s*\}\}[ \t]*$')


def render(chart, template, values_enabled=True):
    """A minimal Helm render of our two templates: if-guard, .Release.Name, the fullname, the
    common labels, the (empty) additionalLabels `with` block, and `{{- .Files.Get "F" | nindent N }}`
    lines."""
    text = open(os.path.join(chart, "templates", template)).read()
    lines = text.rstrip("\n").split("\n")
    guard = GUARD.fullmatch(lines[0])
    if not guard or lines[-1].strip() != "{{- end }}":
        raise AssertionError(f"{template}: not wrapped in {{{{- if .Values.… }}}} … {{{{- end }}}}")
    if not values_enabled:
        return guard.group(1), "", guard.group(2)
    out = []
    skip = 0
    for line in lines[1:-1]:
        if skip:
            if line.strip() == "{{- end }}":
                skip -= 1
            continue
        if re.match(r"\s*\{\{-\s*with\s+\.Values\.prometheusRule\.additionalLabels\s*\}\}", line):
            skip = 1  # values.yaml default: {}
            continue
        m = FILES_GET.match(line)
        if m:
            content = open(os.path.join(chart, m.group("path"))).read()
            pad = " " * int(m.group("n"))
            out.extend((pad + l) if l else pad for l in content.split("\n"))
            continue
        m = LABELS.match(line)
        if m:  # the chart's common labels (checked with helm in tests/charts)
            pad = " " * int(m.group("n"))
            out.extend(pad + l for l in ("app.kubernetes.io/name: vlake", "app.kubernetes.io/instance: release"))
            continue
        if "{{" in line:
            line = line.replace("{{ .Release.Name }}", "release").replace("{{ .Release.Namespace }}", "vlake-system")
            line = line.replace('{{ include "vlake.fullname" . }}', "release-vlake")
            if "{{" in line:
                raise AssertionError(f"{template}: unsupported template construct: {line}")
        out.append(line)
    return guard.group(1), "\n".join(out) + "\n", guard.group(2)


def block_after(text, key_line, indent):
    """The lines after `key_line` indented by at least `indent`, de-indented."""
    lines = text.split("\n")
    i = lines.index(key_line)
    body = []
    for l in lines[i + 1:]:
        if l.strip() and not l.startswith(" " * indent):
            break
        body.append(l[indent:] if len(l) >= indent else "")
    return "\n".join(body).rstrip() + "\n"


def check_dashboard(dash, errors):
    if dash.get("schemaVersion") != 39:
        errors.append(f"schemaVersion is {dash.get('schemaVersion')}, not 39")
    vars_ = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = vars_.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errors.append("no datasource variable 'datasource' of type prometheus")
    # variable -> (metric that always has the label, label): cluster and node from a series every
    # daemon exports, so they list nodes without tenants too.
    want_vars = {"cluster": ("vlake_daemon_up", "cluster"), "node": ("vlake_daemon_up", "node"),
                 "gpu": ("vlake_gpu_memory_total_bytes", "gpu"),
                 "namespace": ("vlake_namespace_limit_bytes", "tenant_namespace"),
                 "pod": ("vlake_tenant_used_bytes", "tenant_pod")}
    for name, (metric, label) in want_vars.items():
        v = vars_.get(name)
        if not v:
            errors.append(f"no template variable {name}")
            continue
        q = v.get("definition", "")
        if not re.fullmatch(r"label_values\(" + metric + r"(\{[^}]*\})?,\s*" + label + r"\)", q):
            errors.append(f"variable {name}: query {q!r} is not label_values({metric}…, {label})")
        if (v.get("query") or {}).get("query") != q:
            errors.append(f"variable {name}: query and definition differ")
        if not (v.get("includeAll") and v.get("multi") and v.get("allValue") == ".*"):
            errors.append(f"variable {name}: needs includeAll, multi and allValue .*")
    ids = set()
    panels = []
    for p in dash.get("panels", []):
        panels.append(p)
        panels.extend(p.get("panels", []))
    for p in panels:
        if p.get("id") in ids:
            errors.append(f"duplicate panel id {p.get('id')}")
        ids.add(p.get("id"))
        if p.get("type") == "row":
            continue
        title = p.get("title")
        if not p.get("targets"):
            errors.append(f"panel {title!r}: no targets")
        refs = set()
        targets = p.get("targets", [])
        if p.get("type") == "table" and len(targets) > 1:
            steps = [x.get("id") for x in p.get("transformations", [])]
            if not steps or steps[0] not in ("merge", "joinByField"):
                errors.append(f"table {title!r}: {len(targets)} queries without a merge/join transformation first")
            for t in targets:
                if not (t.get("instant") and t.get("format") == "table"):
                    errors.append(f"table {title!r} target {t.get('refId')}: not an instant query in table format")
        for t in targets:
            if "_over_limit" in t.get("expr", ""):
                check_state_field(p, t, errors)
            legend = t.get("legendFormat", "")
            for l in TARGET_LABELS:
                if "{{" + l + "}}" in legend:
                    errors.append(f"panel {title!r}: legend {legend!r} shows the target label {l}, not vlaked's tenant_{l}")
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                errors.append(f"panel {title!r}: a target without expr")
                continue
            if t.get("refId") in refs:
                errors.append(f"panel {title!r}: duplicate refId {t.get('refId')}")
            refs.add(t.get("refId"))
            sels = re.findall(r"\b((?:vlake_\w+|up))\s*(\{[^}]*\})?", expr)
            if not sels:
                errors.append(f"panel {title!r}: no metric in {expr}")
            for metric, matchers in sels:
                if metric in ("vlake",):
                    continue
                need = ['cluster=~"$cluster"', 'node=~"$node"']
                if re.match(r"vlake_(tenant|namespace)_", metric):
                    need.append('tenant_namespace=~"$namespace"')
                if re.match(r"vlake_tenant_", metric):
                    need.append('tenant_pod=~"$pod"')
                for n in need:
                    if n not in (matchers or ""):
                        errors.append(f"panel {title!r}: {metric}{matchers} lacks {n}")
                for l in TARGET_LABELS:
                    if re.search(r"(?<![\w])" + l + r"\s*(=~|!~|!=|=)", matchers or ""):
                        errors.append(f"panel {title!r}: {metric}{matchers} filters the target label {l}")
            for l in TARGET_LABELS:
                if re.search(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*(?<![\w])" + l + r"\b", expr):
                    errors.append(f"panel {title!r}: {expr} groups or matches on the target label {l}")


def check_state_field(panel, target, errors):
    """A query of a 0/1 over-limit flag must be shown as a state (value mappings, no byte unit)."""
    title = panel.get("title")
    fc = panel.get("fieldConfig", {})
    ref = target.get("refId")
    rename = {}
    for t in panel.get("transformations", []):
        if t.get("id") == "organize":
            rename = t.get("options", {}).get("renameByName", {})
    names = {ref, f"Value #{ref}", rename.get(f"Value #{ref}")}
    props = []
    for o in fc.get("overrides", []):
        m = o.get("matcher", {})
        if (m.get("id") == "byName" and m.get("options") in names) or (m.get("id") == "byFrameRefID" and m.get("options") == ref):
            props.extend(o.get("properties", []))
    if len(panel.get("targets", [])) == 1:
        props = [{"id": "unit", "value": fc.get("defaults", {}).get("unit")},
                 {"id": "mappings", "value": fc.get("defaults", {}).get("mappings")}] + props
    unit = [x["value"] for x in props if x.get("id") == "unit"]
    mappings = [x["value"] for x in props if x.get("id") == "mappings" and x.get("value")]
    if not unit or unit[-1] in ("bytes", "decbytes", None) or not mappings:
        errors.append(f"panel {title!r}: {target.get('expr')} (a 0/1 flag) needs an override with a non-byte unit and value mappings")


def parse_rules(text):
    """The alert rules of a rules file written as vlake-alerts.yaml is (one `key: value` per
    line), as {"groups": [{"rules": [{"alert", "expr", "annotations"}]}]} (no YAML parser)."""
    rules = []
    for line in text.split("\n"):
        m = re.match(r"\s*-?\s*(alert|record|expr|summary|description|runbook):\s*(.*)$", line)
        if not m:
            continue
        key, value = m.group(1), m.group(2).strip().strip("'\"")
        if key in ("alert", "record"):
            rules.append({key: value, "annotations": {}})
        elif rules and key == "expr":
            rules[-1]["expr"] = value
        elif rules:
            rules[-1]["annotations"][key] = value
    return {"groups": [{"rules": rules}]}


def check_rules(rules, errors):
    """Alert rules use vlaked's tenant_namespace, never the target labels namespace/pod/container."""
    for g in rules.get("groups", []):
        for r in g.get("rules", []):
            name = r.get("alert") or r.get("record")
            texts = [r.get("expr", "")] + list((r.get("annotations") or {}).values())
            for l in TARGET_LABELS:
                for t in texts:
                    if re.search(r"\$labels\." + l + r"\b", t) or re.search(r"(?<![\w.])" + l + r"\s*(=~|!~|!=|=)", t):
                        errors.append(f"alert {name}: uses the target label {l} ({t[:80]}…); vlaked's label is tenant_{l}")


def main():
    chart = sys.argv[1]
    promtool = sys.argv[2] if len(sys.argv) > 2 else "/usr/bin/promtool"
    errors = []

    dash_path = os.path.join(chart, "dashboards", "vlake.json")
    dash = json.load(open(dash_path))
    check_dashboard(dash, errors)

    guard, cm, _ = render(chart, "grafana-dashboard.yaml")
    if guard != ".Values.grafana.dashboard.enabled":
        errors.append(f"grafana-dashboard.yaml guarded by {guard}")
    if 'grafana_dashboard: "1"' not in cm or "kind: ConfigMap" not in cm:
        errors.append("grafana-dashboard.yaml: not a ConfigMap labelled grafana_dashboard: \"1\"")
    try:
        embedded = json.loads(block_after(cm, "  vlake.json: |-", 4))
        if embedded != dash:
            errors.append("the ConfigMap's vlake.json differs from dashboards/vlake.json")
    except (ValueError, json.JSONDecodeError) as e:
        errors.append(f"the ConfigMap's vlake.json is not the dashboard JSON: {e}")

    guard, pr, kind = render(chart, "prometheusrule.yaml")
    if guard != ".Values.prometheusRule.enabled" or kind != "PrometheusRule":
        errors.append(f"prometheusrule.yaml guarded by {guard} and the cluster serving {kind}, not "
                      f".Values.prometheusRule.enabled and PrometheusRule")
    if "apiVersion: monitoring.coreos.com/v1" not in pr or "kind: PrometheusRule" not in pr:
        errors.append("prometheusrule.yaml: not a monitoring.coreos.com/v1 PrometheusRule")
    if "additionalLabels" not in open(os.path.join(chart, "templates", "prometheusrule.yaml")).read():
        errors.append("prometheusrule.yaml: no additionalLabels")
    spec = block_after(pr, "spec:", 2)
    plain = open(os.path.join(chart, "alerts", "vlake-alerts.yaml")).read()
    check_rules(parse_rules(plain), errors)
    if spec.rstrip() != plain.rstrip():
        errors.append("the PrometheusRule's spec is not alerts/vlake-alerts.yaml")
    if not os.access(promtool, os.X_OK):
        print(f"SKIP: {promtool} missing")
        return 77
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(spec)
        f.flush()
        r = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            errors.append(f"promtool check rules on the PrometheusRule's spec:\n{r.stdout}{r.stderr}")

    for e in errors:
        print("FAIL: " + e)
    if not errors:
        print("OK: chart templates, rules and dashboard are consistent")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
