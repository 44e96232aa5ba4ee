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

{{/* id=host:port of every node, at its own Service's name (see services.yaml). */}}
{{- define "felix.peers" -}}
{{- $full := include "felix.fullname" . -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $peers = append $peers (printf "%s-%d=%s-%d.%s.svc.cluster.local:%d" $full $i $full $i $.Release.Namespace (int $.Values.ports.internal)) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}
