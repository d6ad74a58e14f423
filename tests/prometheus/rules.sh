#!/bin/sh
# ctest prometheus.rules: the alert rules file is valid and its unit tests pass.
# Usage: rules.sh CHART_DIR [PROMTOOL]. Exit 77 (skip) only when promtool is missing
# (CI installs Debian's `prometheus` package, which has it).
set -eu
chart=$1
promtool=${2:-$(command -v promtool || true)}
if [ -z "$promtool" ] || [ ! -x "$promtool" ]; then
  echo "SKIP: promtool not installed (Debian package 'prometheus')"
  exit 77
fi
"$promtool" check rules "$chart/alerts/vlake-alerts.yaml"
cd "$chart/alerts"
"$promtool" test rules vlake-alerts.test.yaml
