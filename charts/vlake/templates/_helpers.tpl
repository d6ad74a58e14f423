{{/* Names and labels (Helm conventions: app.kubernetes.io/*, helm.sh/chart). */}}

{{- define "vlake.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-vlake, or the release name alone when it already contains the chart name. */}}
{{- define "vlake.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "vlake.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vlake.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vlake.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "vlake.labels" -}}
helm.sh/chart: {{ include "vlake.chart" . }}
{{ include "vlake.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vlake
{{- end }}

{{- define "vlake.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "vlake.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "vlake.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "vlake.quotaConfigMapName" -}}
{{- default (printf "%s-quota" (include "vlake.fullname" .)) .Values.quota.existingConfigMap }}
{{- end }}

{{/*
The DaemonSet's nodeSelector: .Values.nodeSelector as given ({} selects every node), or when it
is null (the default) the GPU nodes NVIDIA GPU feature discovery labels.
*/}}
{{- define "vlake.nodeSelector" -}}
{{- if kindIs "invalid" .Values.nodeSelector }}
{{- toYaml (dict "nvidia.com/gpu.present" "true") }}
{{- else if .Values.nodeSelector }}
{{- toYaml .Values.nodeSelector }}
{{- end }}
{{- end }}

{{/* Whether the cluster serves a Prometheus Operator kind (monitoring.coreos.com/v1/<kind>). */}}
{{- define "vlake.hasMonitoringKind" -}}
{{- if .root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) }}true{{ end }}
{{- end }}

{{/* The ResourceQuota that admits pods of a system-* priority class outside kube-system. */}}
{{- define "vlake.priorityClassQuota" -}}
{{- if and (dig "priorityClassQuota" "enabled" true .Values.AsMap) (has .Values.priorityClassName (list "system-node-critical" "system-cluster-critical")) (ne .Release.Namespace "kube-system") }}true{{ end }}
{{- end }}

{{/*
The hook's path in the image (the Dockerfile installs it there, as on hosts) and in tenant
containers (the device plugin mounts the node's copy there): vlake's one hook path.
*/}}
{{- define "vlake.imageHookPath" -}}/usr/lib/vlake/libvlake-hook.so{{- end }}
{{- define "vlake.containerHookPath" -}}/usr/lib/vlake/libvlake-hook.so{{- end }}

{{/* Paths inside the containers (= host paths, see values.yaml hostPaths). */}}
{{- define "vlake.socketPath" -}}{{ .Values.hostPaths.run }}/vlaked.sock{{- end }}
{{- define "vlake.stateDir" -}}{{ .Values.hostPaths.run }}/state{{- end }}
{{- define "vlake.statePath" -}}{{ include "vlake.stateDir" . }}/{{ .Values.daemon.stateName }}{{- end }}
{{- define "vlake.allocRoot" -}}{{ .Values.hostPaths.run }}/alloc{{- end }}
{{- define "vlake.hookPath" -}}{{ .Values.hostPaths.hookDir }}/libvlake-hook.so{{- end }}
{{- define "vlake.devicePluginDir" -}}{{ .Values.hostPaths.kubeletRoot }}/device-plugins{{- end }}
{{- define "vlake.podResourcesDir" -}}{{ .Values.hostPaths.kubeletRoot }}/pod-resources{{- end }}

{{/*
A size of the quota file (docs/quota.md, Sizes: vlake's one size grammar, the subset that the
schema admits) in bytes: "4096", 4096, "8GiB", "8Gi", or a percentage of
$gpu bytes ("60%"; $gpu 0 = unknown: fails naming $what). Call with
(dict "size" S "gpu" G "what" "…").
*/}}
{{- define "vlake.sizeBytes" -}}
{{- $s := toString .size }}
{{- if regexMatch "^[0-9]+$" $s }}
{{- $s }}
{{- else if regexMatch "^[0-9]+(B|KiB|MiB|GiB|TiB|Ki|Mi|Gi|Ti)$" $s }}
{{- $n := regexFind "^[0-9]+" $s | int64 }}
{{- $u := trimSuffix "B" (regexFind "[A-Za-z]+$" $s) }}
{{- $mul := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776) $u | int64 }}
{{- mul $n $mul }}
{{- else if regexMatch "^[0-9]+(\\.[0-9]+)?%$" $s }}
{{- if not (int64 .gpu) }}
{{- fail (printf "%s is %s, a percentage: set resourceQuotas.gpuMemory (e.g. 80GiB) to turn it into units" .what $s) }}
{{- end }}
{{- $pct := trimSuffix "%" $s | float64 }}
{{- divf (mulf (int64 .gpu) $pct) 100 | floor | int64 }}
{{- else }}
{{- fail (printf "%s: bad size %q" .what $s) }}
{{- end }}
{{- end }}

{{/*
Values added after chart 0.2.0 default here as in values.yaml: `helm upgrade --reuse-values`
renders with the values of the release it upgrades, which lack them. charts.upgrade
(tests/charts) renders each earlier version's values and checks that the result is what those
values plus this version's defaults give. Scalars use `dig KEY... DEFAULT .Values.AsMap`;
vlake.events is the events block merged over its defaults (YAML: `include ... | fromYaml`).
*/}}
{{- define "vlake.events" -}}
{{- $d := dict "enabled" false "interval" "2s" "maxPerInterval" 20 "logLevel" "info" "extraArgs" (list)
      "resources" (dict "requests" (dict "cpu" "10m" "memory" "16Mi") "limits" (dict "memory" "64Mi")) }}
{{- toYaml (mergeOverwrite $d (deepCopy (.Values.events | default dict))) }}
{{- end }}
