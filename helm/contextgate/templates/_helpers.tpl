{{/* The chart's name, or nameOverride. */}}
{{- define "contextgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of the release's resources: fullnameOverride, else release-chart (the
release name alone when it already contains the chart's). */}}
{{- define "contextgate.fullname" -}}
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

{{- define "contextgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "contextgate.labels" -}}
helm.sh/chart: {{ include "contextgate.chart" . }}
app.kubernetes.io/name: {{ include "contextgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: contextgate
{{- end }}

{{/* Selector labels of the gateway pods (the component keeps Redis pods out). */}}
{{- define "contextgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "contextgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "contextgate.redis.fullname" -}}
{{- printf "%s-redis" (include "contextgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "contextgate.redis.selectorLabels" -}}
app.kubernetes.io/name: {{ include "contextgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "contextgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Whether the gateway has a Redis: the in-chart one or an external one. */}}
{{- define "contextgate.hasRedis" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.url .Values.externalRedis.existingSecret -}}
true
{{- end }}
{{- end }}

{{/* terminationGracePeriodSeconds: the preStop sleep, the gateway's shutdown grace, and a
margin for the process to flush telemetry and exit before Kubernetes sends SIGKILL. */}}
{{- define "contextgate.terminationGracePeriodSeconds" -}}
{{- add (int .Values.shutdown.preStopSleepSeconds) (int (ceil .Values.shutdown.graceSeconds)) 5 }}
{{- end }}

{{/* Refusals: settings the chart cannot deploy sensibly. */}}
{{- define "contextgate.validate" -}}
{{- $replicas := ternary (int .Values.autoscaling.maxReplicas) (int .Values.replicaCount) .Values.autoscaling.enabled }}
{{- if and (gt $replicas 1) (not (include "contextgate.hasRedis" .)) }}
{{- fail "more than one gateway replica needs Redis: replicas share conversations, offloaded content and limits only through it. Enable redis.enabled or set externalRedis.url or externalRedis.existingSecret." }}
{{- end }}
{{- if and .Values.redis.enabled (or .Values.externalRedis.url .Values.externalRedis.existingSecret) }}
{{- fail "redis.enabled and externalRedis are both set: choose one Redis (set redis.enabled=false to use the external one)." }}
{{- end }}
{{- if hasKey .Values.config "shutdown_grace" }}
{{- fail "config.shutdown_grace is set from shutdown.graceSeconds (it also sizes terminationGracePeriodSeconds): set that instead." }}
{{- end }}
{{- range $name, $key := .Values.secrets.keys }}
{{- if and $key (not $.Values.secrets.existingSecret) }}
{{- fail (printf "secrets.keys.%s names a key but secrets.existingSecret is empty: name the Secret that holds it." $name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Credentials from secrets.existingSecret, one variable per key named. */}}
{{- define "contextgate.secretEnv" -}}
{{- $keys := .Values.secrets.keys }}
{{- range $variable, $key := dict "CONTEXTGATE_UPSTREAM_API_KEY" $keys.upstreamApiKey "CONTEXTGATE_ANTHROPIC_API_KEY" $keys.anthropicApiKey "CONTEXTGATE_STORE_SECRET" $keys.storeSecret }}
{{- if $key }}
- name: {{ $variable }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.secrets.existingSecret }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- end }}

{{/* REDIS_URL: the in-chart Redis, or the external one (from its Secret, else its value). */}}
{{- define "contextgate.redisEnv" -}}
{{- if .Values.redis.enabled }}
- name: REDIS_URL
  value: {{ printf "redis://%s:6379/0" (include "contextgate.redis.fullname" .) | quote }}
{{- else if .Values.externalRedis.existingSecret }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.externalRedis.existingSecret }}
      key: {{ .Values.externalRedis.existingSecretKey }}
{{- else if .Values.externalRedis.url }}
- name: REDIS_URL
  value: {{ .Values.externalRedis.url | quote }}
{{- end }}
{{- end }}

{{/* The standard OTEL_* variables, only when an endpoint is configured. */}}
{{- define "contextgate.otelEnv" -}}
{{- with .Values.otel }}
{{- if .endpoint }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: K8S_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .serviceName | default "contextgate" | quote }}
{{- $attributes := list "k8s.pod.name=$(K8S_POD_NAME)" "k8s.namespace.name=$(K8S_NAMESPACE)" }}
{{- range $name, $value := .resourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%v" $name $value) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attributes | quote }}
{{- if .sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .sampler | quote }}
{{- end }}
{{- if .samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplerArg | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
