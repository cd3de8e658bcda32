{{/* The service of a FlexInfer service chart: {{ include "flexinfer.service" . }} in its templates/. */}}
{{- define "flexinfer.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "flexinfer.fullname" . }}
  labels:
    {{- include "flexinfer.labels" . | nindent 4 }}
  {{- with .Values.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ .Values.service.type }}
  selector:
    {{- include "flexinfer.selectorLabels" . | nindent 4 }}
  ports:
    - name: http
      port: {{ .Values.service.port | default .Values.port }}
      targetPort: http
      protocol: TCP
      {{- if and (eq .Values.service.type "NodePort") .Values.service.nodePort }}
      nodePort: {{ .Values.service.nodePort }}
      {{- end }}
{{- end }}
