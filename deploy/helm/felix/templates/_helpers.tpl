{{- define "felix.fullname" -}}
{{- if contains "felix" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-felix" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "felix.headless" -}}
{{- printf "%s-headless" (include "felix.fullname" .) -}}
{{- end -}}

{{- define "felix.labels" -}}
app.kubernetes.io/name: felix
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "felix.selector" -}}
app.kubernetes.io/name: felix
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* id=host:port of every node, at the headless Service's stable names. */}}
{{- define "felix.peers" -}}
{{- $full := include "felix.fullname" . -}}
{{- $headless := include "felix.headless" . -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $peers = append $peers (printf "%s-%d=%s-%d.%s.%s.svc.cluster.local:%d" $full $i $full $i $headless $.Release.Namespace (int $.Values.ports.internal)) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}
