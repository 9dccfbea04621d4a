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

{{/*
A name <prefix>-<suffix> of at most `max` characters that stays unique and readable: a name that
fits is kept whole; a longer one keeps its suffix (the component: `tool-worker-browser-heavy-one`,
`redis`) and cuts the prefix (the release's full name), with the first 8 hex digits of the whole
name's SHA-256 between them: `<prefix cut>-<hash>-<suffix>`. Two long names that differ only in
the part cut away still differ (the hash), and each still says what it is (the suffix). A suffix
too long to leave room for a prefix is cut itself, ending with the hash. Context: (list prefix
suffix max).
*/}}
{{- define "agentstream.shortName" -}}
{{- $prefix := index . 0 }}
{{- $suffix := index . 1 }}
{{- $max := int (index . 2) }}
{{- $name := printf "%s-%s" $prefix $suffix }}
{{- $hash := $name | sha256sum | trunc 8 }}
{{- $room := sub (sub $max (len $suffix)) 10 }}
{{- if le (len $name) $max }}
{{- $name }}
{{- else if ge (int $room) 4 }}
{{- printf "%s-%s-%s" ($prefix | trunc (int $room) | trimSuffix "-") $hash $suffix }}
{{- else }}
{{- printf "%s-%s" ($name | trunc (int (sub $max 9)) | trimSuffix "-") $hash }}
{{- end }}
{{- end }}

{{/*
The bundled Redis' names as 0.1.0 made them (a long name cut to max - 9 characters, then "-" and
8 hex digits of its SHA-256), kept because a StatefulSet's name and serviceName cannot change
without losing its volume or being refused. Context: (list name max).
*/}}
{{- define "agentstream.stableName" -}}
{{- $name := index . 0 }}
{{- $max := int (index . 1) }}
{{- if le (len $name) $max }}
{{- $name }}
{{- else }}
{{- printf "%s-%s" ($name | trunc (int (sub $max 9)) | trimSuffix "-") ($name | sha256sum | trunc 8) }}
{{- end }}
{{- end }}

{{/* A component's resource name: <fullname>-<suffix>, unique, readable and at most 63 characters (agentstream.shortName). Context: (list $ "suffix"). */}}
{{- define "agentstream.componentName" -}}
{{- $root := index . 0 }}
{{- include "agentstream.shortName" (list (include "agentstream.fullname" $root) (index . 1) 63) }}
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

{{/*
An image reference: [registry/]repository, then @digest or :tag. The registry is the image's own
`registry`, else global.imageRegistry (one registry for every image, e.g. a mirror), else none.
Context: (list root image-values default-tag).
*/}}
{{- define "agentstream.imageRef" -}}
{{- $root := index . 0 }}
{{- $image := index . 1 }}
{{- $registry := default (($root.Values.global | default dict).imageRegistry | default "") $image.registry }}
{{- $repository := ternary (printf "%s/%s" $registry $image.repository) $image.repository (ne $registry "") }}
{{- if $image.digest }}
{{- printf "%s@%s" $repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (toString (default (index . 2) $image.tag)) }}
{{- end }}
{{- end }}

{{- define "agentstream.image" -}}
{{- include "agentstream.imageRef" (list . .Values.image .Chart.AppVersion) }}
{{- end }}

{{- define "agentstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* ---------------------------------------------------------------- Redis */}}

{{/*
The bundled Redis' Service and StatefulSet name: at most 52 characters, because the StatefulSet
controller labels its pods with controller-revision-hash=<name>-<10 characters>, a label value
of at most 63.
*/}}
{{- define "agentstream.redis.serviceName" -}}
{{- include "agentstream.stableName" (list (printf "%s-redis" (include "agentstream.fullname" .)) 52) }}
{{- end }}

{{/* The bundled Redis' headless Service name (at most 63 characters). */}}
{{- define "agentstream.redis.headlessName" -}}
{{- include "agentstream.stableName" (list (printf "%s-redis-headless" (include "agentstream.fullname" .)) 63) }}
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

{{/*
The Secret holding the Redis password, or "" for none: redis.auth.existingSecret; else, with the
bundled Redis, the one the chart generates (secret-redis-auth.yaml). Context: root.
*/}}
{{- define "agentstream.redis.secretName" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecret }}
{{- else if .Values.redis.bundled.enabled }}
{{- include "agentstream.componentName" (list . "redis-auth") }}
{{- end }}
{{- end }}

{{/* The key of the password in agentstream.redis.secretName. Context: root. */}}
{{- define "agentstream.redis.secretKey" -}}
{{- if .Values.redis.auth.existingSecret }}{{ .Values.redis.auth.existingSecretPasswordKey }}{{ else }}redis-password{{ end }}
{{- end }}

{{/* Where the pods find the CA certificate of an external Redis' TLS (redis.external.tlsCA). */}}
{{- define "agentstream.redis.caPath" -}}
/etc/agentstream/redis-tls/ca.crt
{{- end }}

{{- define "agentstream.redis.tlsCA" -}}
{{- if and (eq (include "agentstream.redis.tls" .) "true") .Values.redis.external.tlsCA.existingSecret }}true{{ end }}
{{- end }}

{{/* "true" when the external Redis is a Redis Cluster (redis.external.cluster). */}}
{{- define "agentstream.redis.cluster" -}}
{{- if and .Values.redis.external.enabled .Values.redis.external.cluster }}true{{ end }}
{{- end }}

{{/*
The streams of every partition of a work stream, as a list: the name itself for partition 0,
`<stream>:p<k>` for the others (agentstream.wire.keys.partition_stream). Context: (list root stream).
*/}}
{{- define "agentstream.partitionStreams" -}}
{{- $root := index . 0 }}
{{- $stream := index . 1 }}
{{- $out := list $stream }}
{{- range $k := untilStep 1 (int $root.Values.partitions) 1 }}
{{- $out = append $out (printf "%s:p%d" $stream $k) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{- define "agentstream.redis.tls" -}}
{{- if and .Values.redis.external.enabled .Values.redis.external.tls }}true{{ end }}
{{- end }}

{{/*
REDIS_URL. The password is never spliced in here: with a password Secret the URL holds
`$(REDIS_PASSWORD)`, which the kubelet replaces with the REDIS_PASSWORD env var (itself from the
Secret) when it starts the container. That env var must come first in the container's env.
*/}}
{{- define "agentstream.redis.url" -}}
{{- $r := .Values.redis }}
{{- $scheme := ternary "rediss" "redis" (eq (include "agentstream.redis.tls" .) "true") }}
{{- if include "agentstream.redis.cluster" . }}
{{- $scheme = printf "%s+cluster" $scheme }}
{{- end }}
{{- $query := "" }}
{{- if $r.external.enabled }}
{{- $query = (urlParse $r.external.url).query }}
{{- if and $r.external.tls $r.external.tlsSkipVerify }}
{{- $query = trimPrefix "&" (printf "%s&ssl_cert_reqs=none" $query) }}
{{- else if include "agentstream.redis.tlsCA" . }}
{{- $query = trimPrefix "&" (printf "%s&ssl_ca_certs=%s" $query (include "agentstream.redis.caPath" .)) }}
{{- end }}
{{- end }}
{{- $userinfo := "" }}
{{- if include "agentstream.redis.secretName" . }}
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
{{- $names := dict "windowTokens" "window_tokens" "charsPerToken" "chars_per_token" "stream" "stream" "thinkingBudgetTokens" "thinking_budget_tokens" "timeoutSeconds" "timeout_s" "retries" "retries" "quirks" "quirks" "extraBody" "extra_body" "inlineToolSchemas" "inline_tool_schemas" }}
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
extraArgs, extraEnv, extraVolumes and extraVolumeMounts are the defaults' followed by the pool's;
the environment of the pool's MCP server (`mcp`, see _mcp.tpl) comes last.
Autoscaling keys come from autoscaling.* unless the pool sets them. Context: (dict "root" $ "pool" $pool).
Returns YAML: use with fromYaml.
*/}}
{{- define "agentstream.toolPool" -}}
{{- $tw := .root.Values.toolWorkers }}
{{- $as := .root.Values.autoscaling }}
{{- $pool := .pool }}
{{- $out := dict "name" $pool.name "queue" $pool.queue }}
{{- range $k := list "replicas" "concurrency" "app" "resources" "podAnnotations" "podLabels" "nodeSelector" "tolerations" "affinity" "strategy" "lifecycle" }}
{{- $_ := set $out $k (ternary (index $pool $k) (index $tw $k) (hasKey $pool $k)) }}
{{- end }}
{{- range $k := list "extraArgs" "extraEnv" "extraVolumes" "extraVolumeMounts" "sidecars" "initContainers" }}
{{- $_ := set $out $k (default (list) (concat (default (list) (index $tw $k)) (default (list) (index $pool $k)))) }}
{{- end }}
{{- $_ := set $out "extraEnv" (concat $out.extraEnv (include "agentstream.mcpEnv" $pool | fromYamlArray)) }}{{/* the pool's MCP server, see _mcp.tpl */}}
{{- range $k := list "minReplicas" "maxReplicas" }}
{{- $_ := set $out $k (ternary (index $pool $k) (index $as $k) (hasKey $pool $k)) }}
{{- end }}
{{- range $k := list "lagCount" "activationLagCount" "pendingTrigger" }}
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
{{- with include "agentstream.redis.secretName" $root }}
# Defined before REDIS_URL, which refers to it as $(REDIS_PASSWORD).
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ include "agentstream.redis.secretKey" $root }}
{{- end }}
{{- with $v.redis.auth.username }}
- name: REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
- name: REDIS_URL
  value: {{ include "agentstream.redis.url" $root | quote }}
- name: AGENTSTREAM_NAMESPACE
  value: {{ $v.streamNamespace | quote }}
- name: AGENTSTREAM_PARTITIONS
  value: {{ $v.partitions | int | quote }}
{{- with $v.backends }}
- name: AGENTSTREAM_BACKENDS
  value: {{ join "," . | quote }}
{{- end }}
- name: AGENTSTREAM_METRICS_PORT
  value: {{ $v.metricsPort | quote }}
- name: AGENTSTREAM_SHUTDOWN_GRACE_S
  value: {{ $v.shutdownGraceSeconds | quote }}
{{- with $v.limits }}
# The wire's limits (docs/explanation/security.md).
- name: AGENTSTREAM_MAX_TURN_BYTES
  value: {{ .maxTurnBytes | int64 | quote }}
- name: AGENTSTREAM_MAX_METADATA_BYTES
  value: {{ .maxMetadataBytes | int64 | quote }}
- name: AGENTSTREAM_MAX_JSON_DEPTH
  value: {{ .maxJsonDepth | int64 | quote }}
- name: AGENTSTREAM_MAX_ID_BYTES
  value: {{ .maxIdBytes | int64 | quote }}
- name: AGENTSTREAM_MAX_TOOL_ARGUMENTS_BYTES
  value: {{ .maxToolArgumentsBytes | int64 | quote }}
- name: AGENTSTREAM_MAX_TOOL_RESULT_BYTES
  value: {{ .maxToolResultBytes | int64 | quote }}
- name: AGENTSTREAM_EXCERPT_BYTES
  value: {{ .excerptBytes | int64 | quote }}
- name: AGENTSTREAM_ERRORS_MAXLEN
  value: {{ .errorsMaxlen | int64 | quote }}
{{- with .replyStreams }}
- name: AGENTSTREAM_REPLY_STREAMS
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}
{{- with $v.deadlines }}
- name: AGENTSTREAM_MODEL_DEADLINE_S
  value: {{ .modelSeconds | toString | quote }}
{{- if .turnSeconds }}
- name: AGENTSTREAM_TURN_DEADLINE_S
  value: {{ .turnSeconds | toString | quote }}
{{- end }}
{{- end }}
- name: AGENTSTREAM_APP
  value: {{ default $v.app .svc.app | quote }}
{{- with .svc.concurrency }}
- name: AGENTSTREAM_CONCURRENCY
  value: {{ . | quote }}
{{- end }}
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
  {{- with include "agentstream.strategy" (list $root $svc) }}
  {{- . | nindent 2 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "agentstream.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "agentstream.selectorLabels" . | nindent 8 }}
        app.kubernetes.io/part-of: agentstream
        # scraped through its metrics Service when the ServiceMonitor is on (podmonitor.yaml)
        agentstream.io/metrics-service: "true"
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
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- include "agentstream.topologySpread" . | nindent 6 }}
      terminationGracePeriodSeconds: {{ add $v.shutdownGraceSeconds 5 }}
      {{- with include "agentstream.initContainers" (list $root $svc) }}
      {{- . | nindent 6 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "agentstream.image" $root | quote }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          # tini (the image's PID 1) forwards signals and reaps what tools spawn.
          command: ["tini", "--", "agentstream"]
          args:
            {{- toYaml .args | nindent 12 }}
          ports:
            - name: metrics
              containerPort: {{ $v.metricsPort }}
              protocol: TCP
          env:
            {{- include "agentstream.env" . | trim | nindent 12 }}
          {{- with $v.extraEnvFrom }}
          envFrom:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          startupProbe:
            httpGet:
              path: /healthz
              port: metrics
            {{- toYaml $v.probes.startup | nindent 12 }}
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
          {{- with include "agentstream.lifecycle" (list $root $svc) }}
          {{- . | nindent 10 }}
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
            {{- if include "agentstream.redis.tlsCA" $root }}
            - name: redis-tls
              mountPath: {{ include "agentstream.redis.caPath" $root | dir }}
              readOnly: true
            {{- end }}
            {{- with $v.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with $svc.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
        {{- with include "agentstream.sidecars" (list $root $svc) }}
        {{- . | nindent 8 }}
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
        {{- if include "agentstream.redis.tlsCA" $root }}
        - name: redis-tls
          secret:
            secretName: {{ $v.redis.external.tlsCA.existingSecret }}
            items:
              - key: {{ $v.redis.external.tlsCA.key }}
                path: {{ include "agentstream.redis.caPath" $root | base }}
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

{{/*
topologySpreadConstraints of a workload's pods: the global list, each item without a
labelSelector given the workload's selector labels (so it spreads this workload's pods, not every
pod of the release). Renders nothing for an empty list. Context: workload context.
*/}}
{{- define "agentstream.topologySpread" -}}
{{- with .root.Values.topologySpreadConstraints }}
{{- $items := list }}
{{- range $c := . }}
{{- $item := deepCopy $c }}
{{- if not (hasKey $item "labelSelector") }}
{{- $_ := set $item "labelSelector" (dict "matchLabels" (include "agentstream.selectorLabels" $ | fromYaml)) }}
{{- end }}
{{- $items = append $items $item }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $items | nindent 2 }}
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

{{/*
KEDA's scalingModifiers of a tool pool whose stream has several partitions (empty for one): a
formula that adds the triggers of every partition, so the pool follows the total lag (and pending
entries), and its target. With both kinds of trigger each sum is divided by its own target and the
larger taken (target 1); with one kind, its sum against its own target. Context: (dict "pool"
merged-pool "partitions" N). Returns YAML: use with fromYaml.
*/}}
{{- define "agentstream.kedaFormula" -}}
{{- $pool := .pool }}
{{- $n := int .partitions }}
{{- if gt $n 1 }}
{{- $lag := list }}
{{- $pending := list }}
{{- range $k := until $n }}
{{- $lag = append $lag (printf "lag_p%d" $k) }}
{{- $pending = append $pending (printf "pending_p%d" $k) }}
{{- end }}
{{- $lagSum := printf "(%s)" (join " + " $lag) }}
{{- $pendingSum := printf "(%s)" (join " + " $pending) }}
{{- $useLag := gt (int $pool.lagCount) 0 }}
{{- $usePending := $pool.pendingTrigger }}
{{- if and $useLag $usePending }}
{{- $l := printf "%s / %d" $lagSum (int $pool.lagCount) }}
{{- $p := printf "%s / %d" $pendingSum (int $pool.concurrency) }}
formula: {{ printf "%s > %s ? %s : %s" $l $p $l $p | quote }}
target: "1"
activationTarget: {{ divf (int $pool.activationLagCount) (int $pool.lagCount) | toString | quote }}
{{- else if $useLag }}
formula: {{ $lagSum | quote }}
target: {{ $pool.lagCount | toString | quote }}
activationTarget: {{ $pool.activationLagCount | toString | quote }}
{{- else }}
formula: {{ $pendingSum | quote }}
target: {{ $pool.concurrency | toString | quote }}
{{- end }}
metricType: AverageValue
{{- end }}
{{- end }}

{{/*
Bytes of a Kubernetes quantity ("512Mi", "1G", "1.5Gi", "536870912"), as a number; fails naming
`where` when it cannot be read. Context: (list quantity where).
*/}}
{{- define "agentstream.quantityBytes" -}}
{{- $q := toString (index . 0) }}
{{- $where := index . 1 }}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$" $q) }}
{{- fail (printf "%s %q: cannot read it as a memory size (write e.g. 512Mi or 1Gi)" $where $q) }}
{{- end }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q | float64 }}
{{- $unit := trimPrefix (regexFind "^[0-9]+(\\.[0-9]+)?" $q) $q }}
{{- $units := dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "P" 1000000000000000.0 "E" 1000000000000000000.0 }}
{{- mulf $number (get $units $unit) }}
{{- end }}

{{/*
Bytes of a redis.conf size ("400mb", "1gb", "1048576"; values.schema.json allows b, kb, mb, gb,
powers of 1024, in any case), as a number. Context: (list size where).
*/}}
{{- define "agentstream.redisBytes" -}}
{{- $size := lower (toString (index . 0)) }}
{{- $where := index . 1 }}
{{- if not (regexMatch "^[0-9]+(b|kb|mb|gb)?$" $size) }}
{{- fail (printf "%s %q: cannot read it as a Redis size (write e.g. 400mb)" $where $size) }}
{{- end }}
{{- $number := regexFind "^[0-9]+" $size | float64 }}
{{- $units := dict "" 1.0 "b" 1.0 "kb" 1024.0 "mb" 1048576.0 "gb" 1073741824.0 }}
{{- mulf $number (get $units (trimPrefix (regexFind "^[0-9]+" $size) $size)) }}
{{- end }}

{{/*
A Deployment's `strategy:` block: the service's own `strategy`, else updateStrategy (empty:
nothing, Kubernetes' default); with type Recreate, without rollingUpdate (which the API server
refuses there, and which values.yaml's default would otherwise bring). Context: (list root svc).
*/}}
{{- define "agentstream.strategy" -}}
{{- $root := index . 0 }}
{{- $svc := index . 1 }}
{{- with (default $root.Values.updateStrategy $svc.strategy) }}
{{- $st := deepCopy . }}
{{- if eq (default "RollingUpdate" $st.type) "Recreate" }}
{{- $_ := unset $st "rollingUpdate" }}{{/* the default's maxSurge/maxUnavailable do not apply */}}
{{- end }}
strategy:
  {{- toYaml $st | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The init containers, sidecars and lifecycle of a workload's pods: the global lists followed by the
service's own (initContainers, sidecars), and the service's lifecycle, else the global one. Each
renders nothing when empty. Context: (list root svc).
*/}}
{{- define "agentstream.initContainers" -}}
{{- $all := concat (default list (index . 0).Values.initContainers) (default list (index . 1).initContainers) }}
{{- with $all }}
initContainers:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "agentstream.sidecars" -}}
{{- $all := concat (default list (index . 0).Values.sidecars) (default list (index . 1).sidecars) }}
{{- with $all }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "agentstream.lifecycle" -}}
{{- with (default (index . 0).Values.lifecycle (index . 1).lifecycle) }}
lifecycle:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
