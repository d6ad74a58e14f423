#!/usr/bin/env bash
# Packages the Helm chart charts/vlake for distribution (docs/kubernetes.md, "Publishing the
# chart"):
#   OUT/vlake-<version>.tgz   the chart archive: `helm package`, repacked so that the same sources
#                             give the same bytes (entries sorted, owner 0, every mtime
#                             SOURCE_DATE_EPOCH, gzip without name or time)
#   OUT/vlake-<version>.oci/  the same chart as an OCI image layout (oci-layout, index.json,
#                             blobs/sha256/...): the Helm chart artifact `helm push` uploads, i.e.
#                             config application/vnd.cncf.helm.config.v1+json (Chart.yaml as JSON),
#                             one layer application/vnd.cncf.helm.chart.content.v1.tar+gzip (the
#                             archive), a manifest tagged <version> in index.json
#
#   ./scripts/package-chart.sh [OUT]      # default: build/chart
#   helm push build/chart/vlake-<version>.tgz oci://registry.example.com/charts
#   oras cp --from-oci-layout build/chart/vlake-<version>.oci:<version> registry.example.com/charts/vlake:<version>
#
# Needs helm and node with the yaml package (tools/k8s, installed by scripts/setup.sh; the
# variables HELM and NODE override them), GNU tar, gzip and sha256sum. SOURCE_DATE_EPOCH defaults
# to the time of the last commit that touched charts/vlake (0 outside a git checkout).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
chart="$root/charts/vlake"
out="$(mkdir -p "${1:-$root/build/chart}" && cd "${1:-$root/build/chart}" && pwd)"
helm="${HELM:-$root/tools/k8s/bin/helm}"
node="${NODE:-node}"
yaml_pkg="$root/tools/k8s/node_modules/yaml"
for need in "$helm" "$yaml_pkg"; do
  [[ -e "$need" ]] || { echo "package-chart.sh: $need missing (scripts/setup.sh installs tools/k8s)" >&2; exit 1; }
done
command -v "$node" >/dev/null || { echo "package-chart.sh: node not found" >&2; exit 1; }
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct -- charts/vlake 2>/dev/null || true)}"
epoch="${epoch:-0}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# helm keeps its caches and configuration away from $HOME.
export HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" HELM_DATA_HOME="$work/helm/data"

"$helm" lint --strict "$chart" >/dev/null
"$helm" package "$chart" -d "$work/pkg" >/dev/null
archive="$(ls "$work"/pkg/*.tgz)"
name="$(basename "$archive")"
mkdir "$work/tree"
tar -xzmf "$archive" -C "$work/tree"  # m: extracted mtimes are replaced anyway
(cd "$work/tree" && find . -type f -printf '%P\n' | LC_ALL=C sort |
  tar --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --mode='u+rw,go+r,go-w' --format=ustar \
    --no-recursion -T - -cf -) | gzip -9 -n >"$out/$name"
chart_json="$("$helm" show chart "$out/$name" | "$node" -e '
  const Y = require(process.argv[1]);
  let s = "";
  process.stdin.on("data", (d) => (s += d)).on("end", () => {
    const m = Y.parse(s);
    // The field order of Helm'"'"'s chart metadata (what helm push writes as the config).
    const order = ["name", "home", "sources", "version", "description", "keywords", "maintainers", "icon",
      "apiVersion", "condition", "tags", "appVersion", "deprecated", "annotations", "kubeVersion", "dependencies", "type"];
    const o = {};
    for (const k of order) if (m[k] !== undefined) o[k] = m[k];
    process.stdout.write(JSON.stringify(o));
  });' "$yaml_pkg")"

layout="$out/${name%.tgz}.oci"
rm -rf "$layout"
mkdir -p "$layout/blobs/sha256"
blob() {  # blob FILE -> prints "sha256:<hex> <size>" and stores the file in the layout
  local sum size
  sum="$(sha256sum "$1" | cut -d' ' -f1)"
  size="$(stat -c %s "$1")"
  cp "$1" "$layout/blobs/sha256/$sum"
  echo "sha256:$sum $size"
}
printf '%s' "$chart_json" >"$work/config.json"
read -r config_digest config_size < <(blob "$work/config.json")
read -r layer_digest layer_size < <(blob "$out/$name")
"$node" -e '
  const [configDigest, configSize, layerDigest, layerSize, chartJson, created, file] = process.argv.slice(1);
  const chart = JSON.parse(chartJson);
  const manifest = {
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.cncf.helm.config.v1+json", digest: configDigest, size: Number(configSize) },
    layers: [{ mediaType: "application/vnd.cncf.helm.chart.content.v1.tar+gzip", digest: layerDigest, size: Number(layerSize) }],
    annotations: {
      "org.opencontainers.image.created": created,
      "org.opencontainers.image.description": chart.description,
      "org.opencontainers.image.title": chart.name,
      "org.opencontainers.image.version": chart.version,
    },
  };
  require("fs").writeFileSync(file, JSON.stringify(manifest));
' "$config_digest" "$config_size" "$layer_digest" "$layer_size" "$chart_json" \
  "$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)" "$work/manifest.json"
read -r manifest_digest manifest_size < <(blob "$work/manifest.json")
version="$("$node" -e 'process.stdout.write(JSON.parse(process.argv[1]).version)' "$chart_json")"
printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest_digest" "$manifest_size" "$version" >"$layout/index.json"

echo "package-chart.sh: $out/$name ($layer_digest)"
echo "package-chart.sh: $layout (OCI image layout, tag $version, manifest $manifest_digest)"
