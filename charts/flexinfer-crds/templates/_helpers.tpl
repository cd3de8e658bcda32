{{/* Metadata shared by every FlexInfer CRD. */}}
{{- define "flexinfer-crds.metadata" -}}
labels:
  app.kubernetes.io/name: flexinfer
  app.kubernetes.io/component: crds
  app.kubernetes.io/part-of: flexinfer
  app.kubernetes.io/managed-by: {{ .Release.Service }}
  app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
  helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
  {{- with .Values.labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- if or .Values.keep .Values.annotations }}
annotations:
  {{- if .Values.keep }}
  helm.sh/resource-policy: keep
  {{- end }}
  {{- with .Values.annotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end -}}
