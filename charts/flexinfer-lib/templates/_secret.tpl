{{/* The secret of a FlexInfer service chart: {{ include "flexinfer.secret" . }} in its templates/. */}}
{{- define "flexinfer.secret" -}}
{{- if include "flexinfer.secretNeeded" . }}
# Connection values given inline (database URL, admin token). Name an existing Secret in the values instead to
# keep them out of the release.
apiVersion: v1
kind: Secret
metadata:
  name: {{ include "flexinfer.fullname" . }}
  labels:
    {{- include "flexinfer.labels" . | nindent 4 }}
type: Opaque
data:
  {{- include "flexinfer.secretData" . | nindent 2 }}
{{- end }}
{{- end }}
