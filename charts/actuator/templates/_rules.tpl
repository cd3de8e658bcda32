{{/* The actuator's rules on the resources it watches (see rbac.yaml). */}}
{{- define "flexinfer.actuatorRules" -}}
- apiGroups: ["ai.flexinfer"]
  resources: ["models", "gpugroups"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["ai.flexinfer"]
  resources: ["models/status", "gpugroups/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create"]
{{- end }}

{{/* The kubernetes back-end's rendering settings (Models without spec.deployment), from `rendering` and `backends`. */}}
{{- define "flexinfer.renderingEnv" -}}
{{- with .Values.rendering -}}
- name: FLEXINFER_GPU_RESOURCE
  value: {{ .gpuResource | quote }}
- name: FLEXINFER_SHARED_GPU_RESOURCE
  value: {{ .sharedGpuResource | quote }}
- name: FLEXINFER_MODEL_CACHE_CLAIM
  value: {{ .modelCacheClaim | quote }}
- name: FLEXINFER_FLASH_TMPFS_ROOT
  value: {{ .tmpfsRoot | quote }}
- name: FLEXINFER_FLASH_LOADER_IMAGE
  value: {{ .flashLoaderImage | default (include "flexinfer.image" $) | quote }}
- name: FLEXINFER_MODEL_TERMINATION_GRACE
  value: {{ printf "%ds" (int .terminationGracePeriodSeconds) | quote }}
- name: FLEXINFER_MODEL_NODE_SELECTOR
  value: {{ toJson .modelNodeSelector | quote }}
- name: FLEXINFER_MODEL_TOLERATIONS
  value: {{ toJson .modelTolerations | quote }}
- name: FLEXINFER_CLEANUP_TOLERATION
  value: {{ toJson .cleanupToleration | quote }}
{{- end }}
{{- with .Values.backends }}
- name: FLEXINFER_BACKENDS
  value: {{ toJson . | quote }}
{{- end }}
{{- end }}
