{{/*
Helpers of the four FlexInfer service charts (proxy, scheduler, actuator, lease-manager), which depend on this
library chart. What differs per service comes from its values (component, port, backend, ...).
*/}}

{{- define "flexinfer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flexinfer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "flexinfer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flexinfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "flexinfer.labels" -}}
{{ include "flexinfer.selectorLabels" . }}
app.kubernetes.io/component: {{ .Values.component }}
app.kubernetes.io/part-of: flexinfer
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flexinfer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "flexinfer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* global.flexinfer from an umbrella chart, or an empty dict. */}}
{{- define "flexinfer.global" -}}
{{- $g := dict }}
{{- if and .Values.global (kindIs "map" .Values.global) (kindIs "map" .Values.global.flexinfer) }}
{{- $g = .Values.global.flexinfer }}
{{- end }}
{{- toYaml $g }}
{{- end }}

{{/* The image: this chart's values first, then global.flexinfer.image, then the chart's appVersion. */}}
{{- define "flexinfer.image" -}}
{{- $g := (include "flexinfer.global" . | fromYaml).image | default dict }}
{{- $registry := coalesce .Values.image.registry $g.registry "" }}
{{- $tag := coalesce .Values.image.tag $g.tag .Chart.AppVersion | toString }}
{{- if $registry }}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
Connection settings (nats, database, adminToken), each a dict of url/value, existingSecret, existingSecretKey:
this chart's values when they name anything, else global.flexinfer's, else (nats, database) the servers the
umbrella chart runs in the release when global.flexinfer.<key>.install is true (then "install" is true too).
Rendered as YAML; use with fromYaml.
*/}}
{{- define "flexinfer.connections" -}}
{{- $g := include "flexinfer.global" . | fromYaml }}
{{- $out := dict }}
{{- range $key := list "nats" "database" "adminToken" }}
{{- $local := index $.Values $key | default dict }}
{{- $global := index $g $key | default dict }}
{{- if or $local.url $local.value $local.existingSecret }}
{{- $_ := set $out $key $local }}
{{- else if or $global.url $global.value $global.existingSecret $global.generatedSecret }}
{{- $_ := set $out $key (merge (dict) $global (pick $local "existingSecretKey")) }}
{{- else if and $global.install (eq $key "nats") }}
{{- /* The umbrella chart runs NATS in this release (global.flexinfer.nats.install). */}}
{{- $_ := set $out $key (dict "url" (printf "nats://%s-nats:4222" $.Release.Name) "install" true) }}
{{- else if and $global.install (eq $key "database") }}
{{- /* The umbrella chart runs PostgreSQL in this release and keeps its URL in this Secret. */}}
{{- $_ := set $out $key (dict "existingSecret" (printf "%s-postgresql" $.Release.Name) "existingSecretKey" "database-url" "install" true) }}
{{- else }}
{{- $_ := set $out $key $local }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Non-empty for the services that keep state in PostgreSQL; `database` in another chart's values is ignored. */}}
{{- define "flexinfer.usesDatabase" -}}
{{- if has .Values.component (list "scheduler" "lease-manager") }}true{{ end }}
{{- end }}

{{/* FLEXINFER_NATS_URL when no Secret holds it: the values' url, else nats://nats:4222. */}}
{{- define "flexinfer.natsURL" -}}
{{- $c := include "flexinfer.connections" . | fromYaml }}
{{- $c.nats.url | default "nats://nats:4222" }}
{{- end }}

{{/* Non-empty when the chart's own Secret has something to hold. */}}
{{- define "flexinfer.secretNeeded" -}}
{{- include "flexinfer.secretData" . | trim }}
{{- end }}

{{/*
The FLEXINFER_* connection variables. Call with (dict "ctx" $ "secretName" NAME): NAME is the Secret that holds
values given inline (the chart's own Secret, or the migration hook's).
*/}}
{{- define "flexinfer.connectionEnv" -}}
{{- $ := .ctx }}
{{- $c := include "flexinfer.connections" $ | fromYaml }}
{{- $nats := $c.nats }}
- name: FLEXINFER_NATS_URL
{{- if $nats.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ $nats.existingSecret }}
      key: {{ $nats.existingSecretKey | default "nats-url" }}
{{- else }}
  value: {{ include "flexinfer.natsURL" $ | quote }}
{{- end }}
{{- $auth := $.Values.nats | default dict }}
{{- if $auth.credentialsSecret }}
{{- /* This service's own identity on an external NATS: user and password from the operator's Secret. */}}
- name: FLEXINFER_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ $auth.credentialsSecret }}
      key: {{ $auth.userKey | default "user" }}
- name: FLEXINFER_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $auth.credentialsSecret }}
      key: {{ $auth.passwordKey | default "password" }}
{{- else if $nats.install }}
{{- /* The umbrella's bundled NATS: this service's identity (its component) and its generated password. */}}
- name: FLEXINFER_NATS_USER
  value: {{ $.Values.component | quote }}
- name: FLEXINFER_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ printf "%s-nats-auth" $.Release.Name }}
      key: {{ $.Values.component }}
{{- end }}
{{- with $auth.tls }}
{{- if .existingSecret }}
- name: FLEXINFER_NATS_TLS_CA
  value: {{ printf "/etc/flexinfer/nats-tls/%s" (.caKey | default "ca.crt") | quote }}
{{- if .clientCertificate }}
- name: FLEXINFER_NATS_TLS_CERT
  value: "/etc/flexinfer/nats-tls/tls.crt"
- name: FLEXINFER_NATS_TLS_KEY
  value: "/etc/flexinfer/nats-tls/tls.key"
{{- end }}
{{- end }}
{{- end }}
{{- if include "flexinfer.usesDatabase" $ }}
{{- $db := $c.database }}
- name: FLEXINFER_DATABASE_URL
  valueFrom:
    secretKeyRef:
{{- if $db.existingSecret }}
      name: {{ $db.existingSecret }}
      key: {{ $db.existingSecretKey | default "database-url" }}
{{- else }}
      name: {{ .secretName }}
      key: database-url
{{- end }}
{{- end }}
{{- $token := $c.adminToken }}
{{- if $token.existingSecret }}
- name: FLEXINFER_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $token.existingSecret }}
      key: {{ $token.existingSecretKey | default "admin-token" }}
{{- else if and $token.generatedSecret (not $token.value) }}
- name: FLEXINFER_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ tpl $token.generatedSecret $ }}
      key: admin-token
{{- else }}
- name: FLEXINFER_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: admin-token
{{- end }}
{{- end }}

{{/* The data of a Secret holding the connection values given inline. */}}
{{- define "flexinfer.secretData" -}}
{{- $c := include "flexinfer.connections" . | fromYaml }}
{{- if and (include "flexinfer.usesDatabase" .) (not $c.database.existingSecret) }}
database-url: {{ $c.database.url | default "postgresql://flexinfer@postgres:5432/flexinfer" | b64enc | quote }}
{{- end }}
{{- if $c.adminToken.existingSecret }}
{{- else if $c.adminToken.value }}
admin-token: {{ $c.adminToken.value | toString | b64enc | quote }}
{{- else if not $c.adminToken.generatedSecret }}
{{- /* No token given: generate one, and keep the one a previous install generated. */}}
{{- $old := lookup "v1" "Secret" .Release.Namespace (include "flexinfer.fullname" .) }}
admin-token: {{ (and $old $old.data (index $old.data "admin-token")) | default (randAlphaNum 40 | b64enc) | quote }}
{{- end }}
{{- end }}

{{/*
Pod topology spread: topologySpreadConstraints when given; else, with topologySpread.enabled and more than one
replica, one constraint per topologySpread.topologyKeys (nodes, then zones) that prefers spreading
(ScheduleAnyway by default, so a one-node cluster still schedules every replica). matchLabelKeys keeps the pods of
a rolling update's new ReplicaSet from counting against the old one's.
*/}}
{{- define "flexinfer.topologySpread" -}}
{{- if .Values.topologySpreadConstraints }}
{{- toYaml .Values.topologySpreadConstraints }}
{{- else if and .Values.topologySpread.enabled (gt (int .Values.replicaCount) 1) }}
{{- range .Values.topologySpread.topologyKeys }}
- maxSkew: {{ $.Values.topologySpread.maxSkew }}
  topologyKey: {{ . }}
  whenUnsatisfiable: {{ $.Values.topologySpread.whenUnsatisfiable }}
  labelSelector:
    matchLabels:
      {{- include "flexinfer.selectorLabels" $ | nindent 6 }}
  matchLabelKeys:
    - pod-template-hash
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of the pods of this release's FlexInfer services (every chart of one umbrella release shares them). */}}
{{- define "flexinfer.releasePeerLabels" -}}
app.kubernetes.io/part-of: flexinfer
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The in-cluster URL of this chart's Service. */}}
{{- define "flexinfer.serviceURL" -}}
{{- printf "http://%s.%s.svc:%v" (include "flexinfer.fullname" .) .Release.Namespace (.Values.service.port | default .Values.port) }}
{{- end }}
