{{/*
Names, labels and the pieces every agentstream workload shares.

Most helpers below take a "workload context": a dict with
  root       the chart's root context ($)
  component  the service: agent-loop, tool-worker, delegation, compaction or redis
  name       the workload's resource name
  pool       (tool workers only) the pool name
  svc        the service's values (for a tool-worker pool: the merged pool, see agentstream.toolPool)
  args       (agentstream services) the container arguments after `agentstream`
  models     (agent loop, compaction) true for a service that calls models: only these get the
             model endpoints, the models file and the keys
  autoscaled (tool workers) true when KEDA or the HPA owns the replica count
*/}}

{{- define "agentstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or the release name alone when it already contains the chart name. */}}
{{- define "agentstream.fullname" -}}
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

{{/* A component's resource name: <fullname>-<suffix>, at most 63 characters. Context: (list $ "suffix"). */}}
{{- define "agentstream.componentName" -}}
{{- $root := index . 0 }}
{{- printf "%s-%s" (include "agentstream.fullname" $root) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agentstream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. Context: root. */}}
{{- define "agentstream.labels" -}}
helm.sh/chart: {{ include "agentstream.chart" . }}
app.kubernetes.io/name: {{ include "agentstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentstream
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one workload. Context: workload context. */}}
{{- define "agentstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentstream.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
agentstream.io/tool-pool: {{ . }}
{{- end }}
{{- end }}

{{/* Labels of one workload's resources. Context: workload context. */}}
{{- define "agentstream.componentLabels" -}}
{{ include "agentstream.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
agentstream.io/tool-pool: {{ . }}
{{- end }}
{{- end }}

{{/* metadata.annotations from commonAnnotations, if any. Context: root. */}}
{{- define "agentstream.annotations" -}}
{{- with .Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "agentstream.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "agentstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* ---------------------------------------------------------------- Redis */}}

{{/* The bundled Redis' Service name. */}}
{{- define "agentstream.redis.serviceName" -}}
{{- include "agentstream.componentName" (list . "redis") }}
{{- end }}

{{/*
host:port of Redis, as KEDA and the services dial it. The bundled Redis is named by its fully
qualified Service name, because KEDA's operator resolves it from its own namespace.
*/}}
{{- define "agentstream.redis.address" -}}
{{- if .Values.redis.bundled.enabled }}
{{- printf "%s.%s.svc.%s:%d" (include "agentstream.redis.serviceName" .) .Release.Namespace .Values.clusterDomain (int .Values.redis.bundled.port) }}
{{- else }}
{{- $host := (urlParse .Values.redis.external.url).host }}
{{- if contains ":" $host }}{{ $host }}{{ else }}{{ printf "%s:6379" $host }}{{ end }}
{{- end }}
{{- end }}

{{/* The Redis database index ("0" unless the external URL's path names one). */}}
{{- define "agentstream.redis.database" -}}
{{- if .Values.redis.bundled.enabled }}0{{ else }}{{ default "0" (trimPrefix "/" (urlParse .Values.redis.external.url).path) }}{{ end }}
{{- end }}

{{- define "agentstream.redis.tls" -}}
{{- if and .Values.redis.external.enabled .Values.redis.external.tls }}true{{ end }}
{{- end }}

{{/*
REDIS_URL. The password is never spliced in here: with redis.auth.existingSecret the URL holds
`$(REDIS_PASSWORD)`, which the kubelet replaces with the REDIS_PASSWORD env var (itself from the
Secret) when it starts the container. That env var must come first in the container's env.
*/}}
{{- define "agentstream.redis.url" -}}
{{- $r := .Values.redis }}
{{- $scheme := ternary "rediss" "redis" (eq (include "agentstream.redis.tls" .) "true") }}
{{- $query := "" }}
{{- if $r.external.enabled }}
{{- $query = (urlParse $r.external.url).query }}
{{- if and $r.external.tls $r.external.tlsSkipVerify }}
{{- $query = trimPrefix "&" (printf "%s&ssl_cert_reqs=none" $query) }}
{{- end }}
{{- end }}
{{- $userinfo := "" }}
{{- if $r.auth.existingSecret }}
{{- $userinfo = printf "%s:$(REDIS_PASSWORD)@" $r.auth.username }}
{{- else if $r.auth.username }}
{{- $userinfo = printf "%s@" $r.auth.username }}
{{- end }}
{{- printf "%s://%s%s/%s" $scheme $userinfo (include "agentstream.redis.address" .) (include "agentstream.redis.database" .) }}
{{- with $query }}?{{ . }}{{ end }}
{{- end }}

{{/* ---------------------------------------------------------------- Models */}}

{{/* The env var that holds a model's API key: "cheap-v2" → "AGENTSTREAM_KEY_CHEAP_V2". Context: the id. */}}
{{- define "agentstream.modelKeyEnv" -}}
{{- printf "AGENTSTREAM_KEY_%s" (. | upper | replace "-" "_" | replace "." "_") }}
{{- end }}

{{/* Whether a model goes into the models file ("true") rather than OPENAI_*: every model but an OpenAI-compatible `default`. Context: the model. */}}
{{- define "agentstream.modelInFile" -}}
{{- if or (ne .id "default") (eq (default "openai" .provider) "anthropic") }}true{{ end }}
{{- end }}

{{/* A model's settings besides where it is, in the Python side's snake_case names (a dict as YAML). Context: the model. */}}
{{- define "agentstream.modelOptions" -}}
{{- $m := . }}
{{- $out := dict }}
{{- $names := dict "windowTokens" "window_tokens" "charsPerToken" "chars_per_token" "stream" "stream" "thinkingBudgetTokens" "thinking_budget_tokens" "timeoutSeconds" "timeout_s" "retries" "retries" "quirks" "quirks" "extraBody" "extra_body" }}
{{- range $from, $to := $names }}
{{- if hasKey $m $from }}
{{- $_ := set $out $to (index $m $from) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
The models file (AGENTSTREAM_MODELS_FILE, format: agentstream.models.endpoints), or "" when every
model is an OpenAI-compatible `default`. It names each key's env var (api_key_env), never a key.
Context: root.
*/}}
{{- define "agentstream.modelsFile" -}}
{{- $entries := dict }}
{{- range $m := .Values.models }}
{{- if include "agentstream.modelInFile" $m }}
{{- $e := include "agentstream.modelOptions" $m | fromYaml }}
{{- $_ := set $e "provider" (default "openai" $m.provider) }}
{{- $_ := set $e "base_url" $m.baseUrl }}
{{- $_ := set $e "model" $m.model }}
{{- if and $m.apiKey $m.apiKey.existingSecret }}
{{- $_ := set $e "api_key_env" (include "agentstream.modelKeyEnv" $m.id) }}
{{- end }}
{{- $_ := set $entries $m.id $e }}
{{- end }}
{{- end }}
{{- if $entries }}
{{- toYaml (dict "models" $entries) }}
{{- end }}
{{- end }}

{{/* ---------------------------------------------------------------- Tool pools */}}

{{/*
One tool-worker pool's settings: the toolWorkers defaults, overridden by the pool's own keys;
extraArgs, extraEnv, extraVolumes and extraVolumeMounts are the defaults' followed by the pool's.
Autoscaling keys come from autoscaling.* unless the pool sets them. Context: (dict "root" $ "pool" $pool).
Returns YAML: use with fromYaml.
*/}}
{{- define "agentstream.toolPool" -}}
{{- $tw := .root.Values.toolWorkers }}
{{- $as := .root.Values.autoscaling }}
{{- $pool := .pool }}
{{- $out := dict "name" $pool.name "queue" $pool.queue }}
{{- range $k := list "replicas" "app" "resources" "podAnnotations" "podLabels" "nodeSelector" "tolerations" "affinity" }}
{{- $_ := set $out $k (ternary (index $pool $k) (index $tw $k) (hasKey $pool $k)) }}
{{- end }}
{{- range $k := list "extraArgs" "extraEnv" "extraVolumes" "extraVolumeMounts" }}
{{- $_ := set $out $k (default (list) (concat (default (list) (index $tw $k)) (default (list) (index $pool $k)))) }}
{{- end }}
{{- range $k := list "minReplicas" "maxReplicas" }}
{{- $_ := set $out $k (ternary (index $pool $k) (index $as $k) (hasKey $pool $k)) }}
{{- end }}
{{- range $k := list "lagCount" "activationLagCount" "pendingEntriesCount" }}
{{- $_ := set $out $k (ternary (index $pool $k) (index $as.keda $k) (hasKey $pool $k)) }}
{{- end }}
{{- $_ := set $out "targetCPUUtilizationPercentage" (ternary $pool.targetCPUUtilizationPercentage $as.hpa.targetCPUUtilizationPercentage (hasKey $pool "targetCPUUtilizationPercentage")) }}
{{- toYaml $out }}
{{- end }}

{{/* ---------------------------------------------------------------- Pods */}}

{{/* The container env every agentstream service gets. Context: workload context. */}}
{{- define "agentstream.env" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- if $v.redis.auth.existingSecret }}
# Defined before REDIS_URL, which refers to it as $(REDIS_PASSWORD).
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.redis.auth.existingSecret }}
      key: {{ $v.redis.auth.existingSecretPasswordKey }}
{{- end }}
{{- with $v.redis.auth.username }}
- name: REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
- name: REDIS_URL
  value: {{ include "agentstream.redis.url" $root | quote }}
- name: AGENTSTREAM_NAMESPACE
  value: {{ $v.streamNamespace | quote }}
- name: AGENTSTREAM_METRICS_PORT
  value: {{ $v.metricsPort | quote }}
- name: AGENTSTREAM_SHUTDOWN_GRACE_S
  value: {{ $v.shutdownGraceSeconds | quote }}
- name: AGENTSTREAM_APP
  value: {{ default $v.app .svc.app | quote }}
# The pod name: a restarted container keeps its consumer name and drains its own pending entries.
- name: AGENTSTREAM_CONSUMER
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if $v.prompts }}
- name: AGENTSTREAM_PROMPTS_DIR
  value: /etc/agentstream/prompts
{{- end }}
{{- if .models }}
{{- range $m := $v.models }}
{{- if not (include "agentstream.modelInFile" $m) }}
- name: OPENAI_BASE_URL
  value: {{ $m.baseUrl | quote }}
- name: OPENAI_MODEL
  value: {{ $m.model | quote }}
{{- with $m.apiKey }}{{ if .existingSecret }}
- name: OPENAI_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .key }}
{{- end }}{{ end }}
{{- with include "agentstream.modelOptions" $m | fromYaml }}
- name: AGENTSTREAM_DEFAULT_MODEL_OPTIONS
  value: {{ toJson . | quote }}
{{- end }}
{{- else if and $m.apiKey $m.apiKey.existingSecret }}
- name: {{ include "agentstream.modelKeyEnv" $m.id }}
  valueFrom:
    secretKeyRef:
      name: {{ $m.apiKey.existingSecret }}
      key: {{ $m.apiKey.key }}
{{- end }}
{{- end }}
{{- if include "agentstream.modelsFile" $root }}
- name: AGENTSTREAM_MODELS_FILE
  value: /etc/agentstream/models/models.yaml
{{- end }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- with .svc.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Checksum of the prompts ConfigMap's data, so pods restart when a prompt changes. Context: root. */}}
{{- define "agentstream.promptsChecksum" -}}
{{- toJson .Values.prompts | sha256sum }}
{{- end }}

{{/* Checksum of the models file, so pods restart when an endpoint changes. Context: root. */}}
{{- define "agentstream.modelsChecksum" -}}
{{- include "agentstream.modelsFile" . | sha256sum }}
{{- end }}

{{/*
A Deployment of one agentstream service: probes on the metrics port, the security contexts,
terminationGracePeriodSeconds = shutdownGraceSeconds + 5 (the drain time plus a margin for the
process to exit), /tmp as an emptyDir, prompts and the models file from their ConfigMaps. Context: workload context.
*/}}
{{- define "agentstream.deployment" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $svc := .svc }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "agentstream.componentLabels" . | nindent 4 }}
  {{- with include "agentstream.annotations" $root }}
  {{- . | nindent 2 }}
  {{- end }}
spec:
  {{- if not .autoscaled }}
  replicas: {{ $svc.replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      {{- include "agentstream.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "agentstream.selectorLabels" . | nindent 8 }}
        app.kubernetes.io/part-of: agentstream
        {{- with $svc.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        checksum/prompts: {{ include "agentstream.promptsChecksum" $root }}
        {{- if .models }}
        checksum/models: {{ include "agentstream.modelsChecksum" $root }}
        {{- end }}
        {{- with $svc.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "agentstream.serviceAccountName" $root }}
      automountServiceAccountToken: {{ $v.serviceAccount.automountServiceAccountToken }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $v.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ add $v.shutdownGraceSeconds 5 }}
      containers:
        - name: {{ .component }}
          image: {{ include "agentstream.image" $root | quote }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: ["agentstream"]
          args:
            {{- toYaml .args | nindent 12 }}
          ports:
            - name: metrics
              containerPort: {{ $v.metricsPort }}
              protocol: TCP
          env:
            {{- include "agentstream.env" . | trim | nindent 12 }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            {{- toYaml $v.probes.liveness | nindent 12 }}
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            {{- toYaml $v.probes.readiness | nindent 12 }}
          {{- with $svc.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- toYaml $v.containerSecurityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if $v.prompts }}
            - name: prompts
              mountPath: /etc/agentstream/prompts
              readOnly: true
            {{- end }}
            {{- if and .models (include "agentstream.modelsFile" $root) }}
            - name: models
              mountPath: /etc/agentstream/models
              readOnly: true
            {{- end }}
            {{- with $v.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with $svc.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: {{ $v.tmpVolumeSizeLimit }}
        {{- if $v.prompts }}
        - name: prompts
          configMap:
            name: {{ include "agentstream.componentName" (list $root "prompts") }}
        {{- end }}
        {{- if and .models (include "agentstream.modelsFile" $root) }}
        - name: models
          configMap:
            name: {{ include "agentstream.componentName" (list $root "models") }}
        {{- end }}
        {{- with $v.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with $svc.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $svc.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}

{{/* The Service exposing a workload's metrics port (for scraping). Context: workload context. */}}
{{- define "agentstream.metricsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "agentstream.componentLabels" . | nindent 4 }}
    agentstream.io/metrics: "true"
  {{- with include "agentstream.annotations" .root }}
  {{- . | nindent 2 }}
  {{- end }}
spec:
  type: ClusterIP
  selector:
    {{- include "agentstream.selectorLabels" . | nindent 4 }}
  ports:
    - name: metrics
      port: {{ .root.Values.metricsPort }}
      targetPort: metrics
      protocol: TCP
{{- end }}

{{/* A workload's PodDisruptionBudget. Context: workload context plus "pdb" (the pdb values). */}}
{{- define "agentstream.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "agentstream.componentLabels" . | nindent 4 }}
  {{- with include "agentstream.annotations" .root }}
  {{- . | nindent 2 }}
  {{- end }}
spec:
  maxUnavailable: {{ .pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "agentstream.selectorLabels" . | nindent 6 }}
{{- end }}
