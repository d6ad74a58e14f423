#!/usr/bin/env python3
"""ctest prometheus.chart: the Helm chart's monitoring pieces are consistent (no Helm needed).

- templates/prometheusrule.yaml, rendered the way Helm renders it (the `.Files.Get` of
  alerts/vlake-alerts.yaml under `spec:`), carries exactly the plain rules file: one source.
  The rendered `spec` passes `promtool check rules`.
- templates/grafana-dashboard.yaml renders to a ConfigMap labelled grafana_dashboard: "1" whose
  vlake.json is dashboards/vlake.json; both templates are guarded by their values toggle.
- dashboards/vlake.json: schemaVersion 39; variables datasource (prometheus), cluster, node,
  namespace (label_values over vlake_tenant_used_bytes, includeAll + multi); unique panel ids;
  every target has an expr, and every metric selector in it filters cluster=~"$cluster",
  node=~"$node" (and namespace=~"$namespace" for tenant/namespace metrics).
Stdlib only. Exit 0 pass, 1 fail, 77 when promtool is missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

FILES_GET = re.compile(r'^(?P<lead>[ \t]*)\{\{-\s*\.Files\.Get\s+"(?P<path>[^"]+)"\s*\|\s*nindent\s+(?P<n>\d+)\s*\}\}[ \t]*$')


def render(chart, template, values_enabled=True):
    """A minimal Helm render of our two templates: if-guard, .Release.Name, the (empty)
    additionalLabels `with` block, and `{{- .Files.Get "F" | nindent N }}` lines."""
    text = open(os.path.join(chart, "templates", template)).read()
    lines = text.rstrip("\n").split("\n")
    guard = re.fullmatch(r"\{\{-\s*if\s+(\.Values\.[\w.]+)\s*\}\}", lines[0])
    if not guard or lines[-1].strip() != "{{- end }}":
        raise AssertionError(f"{template}: not wrapped in {{{{- if .Values.… }}}} … {{{{- end }}}}")
    if not values_enabled:
        return guard.group(1), ""
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
        if "{{" in line:
            line = line.replace("{{ .Release.Name }}", "release")
            if "{{" in line:
                raise AssertionError(f"{template}: unsupported template construct: {line}")
        out.append(line)
    return guard.group(1), "\n".join(out) + "\n"


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
    for name in ("cluster", "node", "namespace"):
        v = vars_.get(name)
        if not v:
            errors.append(f"no template variable {name}")
            continue
        q = v.get("definition", "")
        if not re.fullmatch(r"label_values\(vlake_tenant_used_bytes(\{[^}]*\})?,\s*" + name + r"\)", q):
            errors.append(f"variable {name}: query {q!r} is not label_values(vlake_tenant_used_bytes…, {name})")
        if not (v.get("includeAll") and v.get("multi")):
            errors.append(f"variable {name}: needs includeAll and multi")
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
        for t in p.get("targets", []):
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
                    need.append('namespace=~"$namespace"')
                for n in need:
                    if n not in (matchers or ""):
                        errors.append(f"panel {title!r}: {metric}{matchers} lacks {n}")


def main():
    chart = sys.argv[1]
    promtool = sys.argv[2] if len(sys.argv) > 2 else "/usr/bin/promtool"
    errors = []

    dash_path = os.path.join(chart, "dashboards", "vlake.json")
    dash = json.load(open(dash_path))
    check_dashboard(dash, errors)

    guard, cm = render(chart, "grafana-dashboard.yaml")
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

    guard, pr = render(chart, "prometheusrule.yaml")
    if guard != ".Values.prometheusRule.enabled":
        errors.append(f"prometheusrule.yaml guarded by {guard}")
    if "apiVersion: monitoring.coreos.com/v1" not in pr or "kind: PrometheusRule" not in pr:
        errors.append("prometheusrule.yaml: not a monitoring.coreos.com/v1 PrometheusRule")
    if "additionalLabels" not in open(os.path.join(chart, "templates", "prometheusrule.yaml")).read():
        errors.append("prometheusrule.yaml: no additionalLabels")
    spec = block_after(pr, "spec:", 2)
    plain = open(os.path.join(chart, "alerts", "vlake-alerts.yaml")).read()
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
