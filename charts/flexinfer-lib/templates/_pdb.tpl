{{/*
The PodDisruptionBudget: on by default, rendered only with more than one replica (a budget on a single replica
either blocks every node drain or protects nothing). maxUnavailable (default 1) lets a drain evict one pod at a
time; minAvailable instead, when set, must leave at least one pod evictable.
*/}}
{{- define "flexinfer.pdb" -}}
{{- $pdb := .Values.podDisruptionBudget }}
{{- $replicas := int .Values.replicaCount }}
{{- if and $pdb.enabled (gt $replicas 1) }}
{{- $min := $pdb.minAvailable }}
{{- if and (kindIs "float64" $min) (ge (int $min) $replicas) }}
{{- fail (printf "podDisruptionBudget.minAvailable (%d) must be below replicaCount (%d), or no node could ever be drained" (int $min) $replicas) }}
{{- end }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "flexinfer.fullname" . }}
  labels:
    {{- include "flexinfer.labels" . | nindent 4 }}
spec:
  {{- if not (kindIs "invalid" $min) }}
  minAvailable: {{ $min }}
  {{- else }}
  maxUnavailable: {{ $pdb.maxUnavailable }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "flexinfer.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}
