{{/* The servicemonitor of a FlexInfer service chart: {{ include "flexinfer.servicemonitor" . }} in its templates/. */}}
{{- define "flexinfer.servicemonitor" -}}
{{- if .Values.metrics.serviceMonitor.enabled }}
# For the Prometheus Operator; without it, the pods' prometheus.io/* annotations serve annotation-based scraping.
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "flexinfer.fullname" . }}
  labels:
    {{- include "flexinfer.labels" . | nindent 4 }}
    {{- with .Values.metrics.serviceMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "flexinfer.selectorLabels" . | nindent 6 }}
  endpoints:
    - port: http
      path: /metrics
      interval: {{ .Values.metrics.serviceMonitor.interval }}
      scrapeTimeout: {{ .Values.metrics.serviceMonitor.scrapeTimeout }}
{{- end }}
{{- end }}
