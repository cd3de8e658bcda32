{{/*
The NetworkPolicy (networkPolicy.enabled): ingress to the service's port only. networkPolicy.external (the proxy's
default) admits any client; otherwise only the pods of this release (app.kubernetes.io/part-of=flexinfer and
app.kubernetes.io/instance=<release>: the other FlexInfer services and the `helm test` pods) and the peers listed in
networkPolicy.ingressFrom (e.g. your Prometheus' namespace, for /metrics). Egress is not restricted: the services
reach NATS, PostgreSQL, the models and the Kubernetes API.
*/}}
{{- define "flexinfer.networkpolicy" -}}
{{- if .Values.networkPolicy.enabled }}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "flexinfer.fullname" . }}
  labels:
    {{- include "flexinfer.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "flexinfer.selectorLabels" . | nindent 6 }}
  policyTypes:
    - Ingress
  ingress:
    - ports:
        - port: http
          protocol: TCP
      {{- if not .Values.networkPolicy.external }}
      from:
        - podSelector:
            matchLabels:
              {{- include "flexinfer.releasePeerLabels" . | nindent 14 }}
        {{- with .Values.networkPolicy.ingressFrom }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
{{- end }}
{{- end }}
