{{/* The serviceaccount of a FlexInfer service chart: {{ include "flexinfer.serviceaccount" . }} in its templates/. */}}
{{- define "flexinfer.serviceaccount" -}}
{{- if .Values.serviceAccount.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "flexinfer.serviceAccountName" . }}
  labels:
    {{- include "flexinfer.labels" . | nindent 4 }}
  {{- with .Values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: {{ .Values.serviceAccount.automount }}
{{- end }}
{{- end }}
