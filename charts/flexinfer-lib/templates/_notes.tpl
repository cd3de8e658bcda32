{{/*
The NOTES of a service chart: what this release configured, read from the values it rendered with (replicas,
disruption budget, spread, connections, admin token, network policy, metrics), and how to check it. A chart's own
NOTES.txt includes this, then says what is particular to its service.
*/}}
{{- define "flexinfer.notes" -}}
{{- $fullname := include "flexinfer.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $port := .Values.service.port | default .Values.port }}
{{- $replicas := int .Values.replicaCount }}
{{- $c := include "flexinfer.connections" . | fromYaml -}}
FlexInfer {{ .Values.component }} {{ .Chart.AppVersion }} is deployed as {{ $fullname }} in {{ $ns }}.

Replicas: {{ $replicas }}
{{- if and .Values.podDisruptionBudget.enabled (gt $replicas 1) }}, PodDisruptionBudget {{ $fullname }}
{{- if not (kindIs "invalid" .Values.podDisruptionBudget.minAvailable) }} (minAvailable {{ .Values.podDisruptionBudget.minAvailable }})
{{- else }} (maxUnavailable {{ .Values.podDisruptionBudget.maxUnavailable }})
{{- end }}
{{- else }}, no PodDisruptionBudget{{ if le $replicas 1 }} (one replica: a budget would block node drains or protect nothing){{ end }}
{{- end }}
{{- if include "flexinfer.topologySpread" . }}, spread by topologySpreadConstraints{{ end }}.
NATS: {{ if $c.nats.existingSecret }}from Secret {{ $c.nats.existingSecret }} (key {{ $c.nats.existingSecretKey | default "nats-url" }}){{ else }}{{ include "flexinfer.natsURL" . }}{{ end }}
{{- if include "flexinfer.usesDatabase" . }}
PostgreSQL: {{ if $c.database.existingSecret }}from Secret {{ $c.database.existingSecret }} (key {{ $c.database.existingSecretKey | default "database-url" }}){{ else if $c.database.url }}the URL given in the values (kept in Secret {{ $fullname }}){{ else }}postgresql://flexinfer@postgres:5432/flexinfer (the default: set database.url or database.existingSecret){{ end }}
{{- end }}
Admin token (every /api/v1 call needs it as a bearer token): {{ if $c.adminToken.existingSecret }}Secret {{ $c.adminToken.existingSecret }}, key {{ $c.adminToken.existingSecretKey | default "admin-token" }}
{{- else if $c.adminToken.value }}given in the values, kept in Secret {{ $fullname }}
{{- else if $c.adminToken.generatedSecret }}generated into Secret {{ tpl $c.adminToken.generatedSecret . }}
{{- else }}generated into Secret {{ $fullname }} (kept across upgrades){{ end }}
{{- $tokenSecret := $c.adminToken.existingSecret | default (ternary (tpl ($c.adminToken.generatedSecret | default "") .) $fullname (and (not $c.adminToken.value) (not (empty $c.adminToken.generatedSecret)))) }}
  export FLEXINFER_ADMIN_TOKEN=$(kubectl -n {{ $ns }} get secret {{ $tokenSecret }} -o jsonpath='{.data.{{ $c.adminToken.existingSecretKey | default "admin-token" }}}' | base64 -d)
{{- if .Values.networkPolicy.enabled }}
NetworkPolicy {{ $fullname }}: port {{ .Values.port }} admits {{ if .Values.networkPolicy.external }}any client{{ else }}only this release's pods{{ if .Values.networkPolicy.ingressFrom }} and the {{ len .Values.networkPolicy.ingressFrom }} peer(s) of networkPolicy.ingressFrom{{ end }}{{ end }}.
{{- else }}
No NetworkPolicy: any pod that can route to it reaches port {{ .Values.port }} (networkPolicy.enabled restricts it).
{{- end }}
Metrics: /metrics on port {{ .Values.port }}
{{- if .Values.metrics.serviceMonitor.enabled }}, ServiceMonitor {{ $fullname }}{{ end }}
{{- if .Values.metrics.podAnnotations }}, prometheus.io/* pod annotations{{ end }}.

Check it:
  kubectl -n {{ $ns }} rollout status deployment/{{ $fullname }}
{{- if .Values.tests.enabled }}
  helm test {{ .Release.Name }} -n {{ $ns }}          # GET {{ include "flexinfer.serviceURL" . }}/readyz from a pod
{{- end }}
  kubectl -n {{ $ns }} port-forward service/{{ $fullname }} {{ $port }}:{{ $port }}
  curl -s http://127.0.0.1:{{ $port }}/readyz
{{- end }}
