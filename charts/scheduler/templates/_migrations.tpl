{{/* Labels of the migration hook (scheduler chart only): not the Deployment's selector labels. */}}
{{- define "flexinfer.migrationLabels" -}}
app.kubernetes.io/name: {{ include "flexinfer.name" . }}-migrations
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: migrations
app.kubernetes.io/part-of: flexinfer
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}
