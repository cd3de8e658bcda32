{{/*
`helm test`: a Pod (a test hook) that asks the service's Service for /readyz with the service's own image (no other
image to pull), and fails unless it answers 200: the service runs and reaches its dependencies (NATS, PostgreSQL).
*/}}
{{- define "flexinfer.test" -}}
{{- if .Values.tests.enabled }}
apiVersion: v1
kind: Pod
metadata:
  name: {{ printf "%s-test-readyz" (include "flexinfer.fullname" .) | trunc 63 | trimSuffix "-" }}
  labels:
    {{- include "flexinfer.releasePeerLabels" . | nindent 4 }}
    app.kubernetes.io/name: {{ include "flexinfer.name" . }}-test
    app.kubernetes.io/component: test
    app.kubernetes.io/managed-by: {{ .Release.Service }}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: readyz
      image: {{ include "flexinfer.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command:
        - python
        - -c
        - |
          import sys, urllib.error, urllib.request
          url = sys.argv[1] + "/readyz"
          try:
              with urllib.request.urlopen(url, timeout=10) as answer:
                  print(url, answer.status, answer.read().decode())
          except urllib.error.HTTPError as error:
              sys.exit(f"{url} answered {error.code}: {error.read().decode()}")
          except OSError as error:
              sys.exit(f"{url} did not answer: {error}")
        - {{ include "flexinfer.serviceURL" . | quote }}
      resources:
        requests:
          cpu: 10m
          memory: 32Mi
        limits:
          memory: 64Mi
      {{- with .Values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
{{- end }}
