{{/* The deployment of a FlexInfer service chart: {{ include "flexinfer.deployment" . }} in its templates/. */}}
{{- define "flexinfer.deployment" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "flexinfer.fullname" . }}
  labels:
    {{- include "flexinfer.labels" . | nindent 4 }}
spec:
  replicas: {{ .Values.replicaCount }}
  revisionHistoryLimit: {{ .Values.revisionHistoryLimit }}
  {{- with .Values.strategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "flexinfer.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "flexinfer.labels" . | nindent 8 }}
        {{- with .Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        {{- if .Values.metrics.podAnnotations }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ .Values.port | quote }}
        prometheus.io/path: /metrics
        {{- end }}
        {{- if include "flexinfer.secretNeeded" . }}
        checksum/secret: {{ include "flexinfer.secretData" . | sha256sum }}
        {{- end }}
        {{- with .Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "flexinfer.serviceAccountName" . }}
      automountServiceAccountToken: {{ .Values.serviceAccount.automount }}
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with .Values.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      # SIGTERM starts a graceful shutdown (see the service's README); this is how long it may take.
      terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
      containers:
        - name: {{ .Values.component }}
          image: {{ include "flexinfer.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          ports:
            - name: http
              containerPort: {{ .Values.port }}
              protocol: TCP
          env:
            - name: {{ printf "FLEXINFER_%s_PORT" (.Values.component | upper | replace "-" "_") }}
              value: {{ .Values.port | quote }}
            # The pod's address (the Service reaches it there); the admin token below is then required.
            - name: FLEXINFER_BIND_HOST
              value: "0.0.0.0"
            {{- include "flexinfer.connectionEnv" (dict "ctx" . "secretName" (include "flexinfer.fullname" .)) | trim | nindent 12 }}
            {{- with .Values.backend }}
            - name: FLEXINFER_ACTUATOR
              value: {{ . | quote }}
            {{- end }}
            - name: FLEXINFER_NAMESPACE
              value: {{ .Values.modelNamespace | default .Release.Namespace | quote }}
            - name: FLEXINFER_INSTANCE_ID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: FLEXINFER_LOG_LEVEL
              value: {{ .Values.logLevel | quote }}
            {{- with .Values.stateDir }}
            - name: FLEXINFER_STATE_DIR
              value: {{ . | quote }}
            {{- end }}
            {{- with .Values.watchNamespaces }}
            - name: FLEXINFER_WATCH_NAMESPACES
              value: {{ join "," . | quote }}
            {{- end }}
            {{- with .Values.leaderElection }}
            - name: FLEXINFER_LEADER_ELECTION
              value: {{ .enabled | quote }}
            - name: FLEXINFER_LEADER_ELECTION_LEASE
              value: {{ .leaseName | quote }}
            {{- end }}
            {{- with .Values.rendering }}
            {{- include "flexinfer.renderingEnv" $ | nindent 12 }}
            {{- end }}
            {{- /* global.flexinfer.env for every service; this chart's own env wins for a name both set */}}
            {{- $globalEnv := (include "flexinfer.global" . | fromYaml).env | default dict }}
            {{- range $name, $value := merge (deepCopy (.Values.env | default dict)) $globalEnv }}
            - name: {{ $name }}
              value: {{ $value | toString | quote }}
            {{- end }}
            {{- with .Values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with .Values.envFrom }}
          envFrom:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          # /healthz: the process answers. /readyz: its dependencies (NATS, Postgres) answer too.
          startupProbe:
            httpGet:
              path: /healthz
              port: http
            {{- toYaml .Values.probes.startup | nindent 12 }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: http
            {{- toYaml .Values.probes.liveness | nindent 12 }}
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
            {{- toYaml .Values.probes.readiness | nindent 12 }}
          {{- with .Values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with .Values.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with .Values.lifecycle }}
          lifecycle:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- with .Values.stateDir }}
            - name: state
              mountPath: {{ . }}
            {{- end }}
            {{- if ((.Values.nats).tls).existingSecret }}
            - name: nats-tls
              mountPath: /etc/flexinfer/nats-tls
              readOnly: true
            {{- end }}
            {{- with .Values.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        # The root filesystem is read-only; these are the writable places.
        - name: tmp
          emptyDir: {}
        {{- if .Values.stateDir }}
        - name: state
          emptyDir: {}
        {{- end }}
        {{- with ((.Values.nats).tls).existingSecret }}
        # TLS to NATS: the CA that signed its certificate (ca.crt) and, for mutual TLS, this service's own.
        - name: nats-tls
          secret:
            secretName: {{ . }}
            defaultMode: 0400
        {{- end }}
        {{- with .Values.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with include "flexinfer.topologySpread" . }}
      topologySpreadConstraints:
        {{- . | nindent 8 }}
      {{- end }}
{{- end }}
