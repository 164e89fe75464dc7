{{/*
Names, labels and the pieces several templates share. Every name the chart gives an object
comes from here, so the Deployment flags, the RBAC resourceNames and the webhook
configurations can never disagree.
*/}}

{{- define "podmend.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-podmend", or the release name alone when it already contains the chart name. */}}
{{- define "podmend.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "podmend.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "podmend.selectorLabels" -}}
app.kubernetes.io/name: {{ include "podmend.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "podmend.labels" -}}
helm.sh/chart: {{ include "podmend.chart" . }}
{{ include "podmend.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: podmend
{{- end }}

{{- define "podmend.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "podmend.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The podmend image: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "podmend.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Object names. */}}
{{- define "podmend.serviceName" -}}{{ include "podmend.fullname" . }}{{- end }}
{{- define "podmend.configMapName" -}}{{ include "podmend.fullname" . }}-config{{- end }}
{{- define "podmend.mutatingName" -}}{{ include "podmend.fullname" . }}-mutating{{- end }}
{{- define "podmend.validatingName" -}}{{ include "podmend.fullname" . }}-validating{{- end }}
{{- define "podmend.servingCertificateName" -}}{{ include "podmend.fullname" . }}-serving{{- end }}

{{/* The Secret holding tls.crt/tls.key (and ca.crt in modes self and certManager). */}}
{{- define "podmend.tlsSecretName" -}}
{{- if eq .Values.tls.mode "secret" }}
{{- .Values.tls.secret.name }}
{{- else }}
{{- include "podmend.fullname" . }}-tls
{{- end }}
{{- end }}

{{/* Ports and paths. The paths equal src/server/paths.rs (tests/chart checks). */}}
{{- define "podmend.webhookPort" -}}{{ int .Values.webhook.port }}{{- end }}
{{- define "podmend.metricsPort" -}}9090{{- end }}
{{- define "podmend.servicePort" -}}443{{- end }}
{{- define "podmend.mutatePath" -}}/mutate{{- end }}
{{- define "podmend.validatePath" -}}/validate{{- end }}
{{- define "podmend.healthzPath" -}}/healthz{{- end }}
{{- define "podmend.readyzPath" -}}/readyz{{- end }}
{{- define "podmend.metricsPath" -}}/metrics{{- end }}

{{/*
"true" when webhook.url is set: podmend runs outside the cluster (for development and
tests), so the chart renders no Deployment, Service, PodDisruptionBudget, ServiceMonitor or
`helm test` pod for it. Empty otherwise.
*/}}
{{- define "podmend.external" -}}
{{- if .Values.webhook.url }}true{{ end }}
{{- end }}

{{/* webhook.url without trailing slashes: the webhook paths are appended to it. */}}
{{- define "podmend.externalURL" -}}
{{- regexReplaceAll "/+$" .Values.webhook.url "" }}
{{- end }}

{{/* The node reaper's objects (templates/reaper.yaml). */}}
{{- define "podmend.reaperName" -}}{{ include "podmend.fullname" . }}-reaper{{- end }}
{{/* Where the reaper mounts the node's Docker socket: where the guard mounts it (src/dind.rs HOST_SOCKET_DIR). */}}
{{- define "podmend.reaperSocket" -}}/podmend/host/docker.sock{{- end }}

{{/*
A size as `guard reap --images-high` takes it (bytes, or a quantity with a decimal or binary
suffix, as the schema allows), in bytes, as a float: for comparing the two marks.
*/}}
{{- define "podmend.bytes" -}}
{{- $text := toString . }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $text }}
{{- $units := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 }}
{{- mulf (float64 $number) (get $units (trimPrefix $number $text)) }}
{{- end }}

{{/* Mount points in the webhook container. */}}
{{- define "podmend.configDir" -}}/etc/podmend/config{{- end }}
{{- define "podmend.tlsDir" -}}/etc/podmend/tls{{- end }}

{{/*
A rule mode as a string. Unquoted YAML `off` arrives as the boolean false; it means "off".
*/}}
{{- define "podmend.mode" -}}
{{- if kindIs "bool" . }}{{ if . }}enforce{{ else }}off{{ end }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/*
"true" when some rule acts on pod templates (its mode and its templates mode are not off):
only then do the webhooks receive Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs
and CronJobs. Empty otherwise.
*/}}
{{- define "podmend.templatesActive" -}}
{{- $active := false }}
{{- range $rule := list .Values.rules.nodeAffinity .Values.rules.agentRequests .Values.rules.dindRm }}
{{- if and (ne (include "podmend.mode" $rule.mode) "off") (ne (include "podmend.mode" $rule.templates) "off") }}
{{- $active = true }}
{{- end }}
{{- end }}
{{- if $active }}true{{ end }}
{{- end }}

{{/*
"true" when some rule refuses objects (its mode or its templates mode is deny): only then is
the validating webhook registered, since it answers "allowed" to everything otherwise and
each call it receives is one more that an unreachable webhook holds up. Empty otherwise.
*/}}
{{- define "podmend.denyActive" -}}
{{- $active := false }}
{{- range $rule := list .Values.rules.nodeAffinity .Values.rules.agentRequests .Values.rules.dindRm }}
{{- if or (eq (include "podmend.mode" $rule.mode) "deny") (eq (include "podmend.mode" $rule.templates) "deny") }}
{{- $active = true }}
{{- end }}
{{- end }}
{{- if eq (include "podmend.mode" .Values.rules.virtualNodePhase.mode) "deny" }}
{{- $active = true }}
{{- end }}
{{- if $active }}true{{ end }}
{{- end }}

{{/* "true" when the opt-in virtual-node-phase rule is on (the pods/status rule); empty otherwise. */}}
{{- define "podmend.virtualNodePhaseActive" -}}
{{- if ne (include "podmend.mode" .Values.rules.virtualNodePhase.mode) "off" }}true{{ end }}
{{- end }}

{{/*
Namespaces never sent to the webhook: kube-system, the release namespace (so the webhook
never blocks its own pods), and webhook.skipNamespaces. A JSON list.
*/}}
{{- define "podmend.excludedNamespaces" -}}
{{- $names := list "kube-system" .Release.Namespace }}
{{- range .Values.webhook.skipNamespaces }}{{ $names = append $names . }}{{ end }}
{{- toJson (uniq $names) }}
{{- end }}

{{/*
The part of a webhook both configurations share. Call with
(dict "ctx" $ "mutating" true|false), plus "status" true for the pods/status webhook of
virtual-node-phase (its own entry, so its rule and match condition touch nothing else).
*/}}
{{- define "podmend.webhookCommon" -}}
{{- $ctx := .ctx }}
{{- $v := $ctx.Values -}}
admissionReviewVersions: ["v1"]
sideEffects: None
{{- if .status }}
# Always fail-open: a missed phase correction costs seconds; a refused status write would
# stall every Pending pod in the selected namespaces while podmend is away.
failurePolicy: Ignore
{{- else }}
failurePolicy: {{ $v.webhook.failurePolicy }}
{{- end }}
timeoutSeconds: {{ $v.webhook.timeoutSeconds }}
matchPolicy: Equivalent
{{- $path := include "podmend.validatePath" $ctx }}
{{- if .mutating }}{{ $path = include "podmend.mutatePath" $ctx }}{{ end }}
clientConfig:
  {{- if include "podmend.external" $ctx }}
  # webhook.url: podmend runs outside the cluster (validate.yaml checks the URL).
  url: {{ printf "%s%s" (include "podmend.externalURL" $ctx) $path | quote }}
  {{- else }}
  service:
    name: {{ include "podmend.serviceName" $ctx }}
    namespace: {{ $ctx.Release.Namespace }}
    path: {{ $path }}
    port: {{ include "podmend.servicePort" $ctx }}
  {{- end }}
  {{- if eq $v.tls.mode "secret" }}
  caBundle: {{ $v.tls.secret.caBundle }}
  {{- end }}
rules:
  {{- if .status }}
  - operations: ["UPDATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods/status"]
    scope: Namespaced
  {{- else }}
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods"]
    scope: Namespaced
  {{- if include "podmend.templatesActive" $ctx }}
  - operations: ["CREATE", "UPDATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["podtemplates", "replicationcontrollers"]
    scope: Namespaced
  - operations: ["CREATE", "UPDATE"]
    apiGroups: ["apps"]
    apiVersions: ["v1"]
    resources: ["deployments", "replicasets", "statefulsets", "daemonsets"]
    scope: Namespaced
  - operations: ["CREATE", "UPDATE"]
    apiGroups: ["batch"]
    apiVersions: ["v1"]
    resources: ["jobs", "cronjobs"]
    scope: Namespaced
  {{- end }}
  {{- end }}
namespaceSelector:
  {{- with $v.webhook.namespaceSelector.matchLabels }}
  matchLabels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ include "podmend.excludedNamespaces" $ctx }}
    - key: podmend.io/ignore
      operator: DoesNotExist
    {{- with $v.webhook.namespaceSelector.matchExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- if or $v.webhook.objectSelector.matchLabels $v.webhook.objectSelector.matchExpressions }}
objectSelector:
  {{- toYaml $v.webhook.objectSelector | nindent 2 }}
{{- end }}
# CEL over `object`/`oldObject` as untyped maps (null on DELETE and CREATE respectively).
# An error is never a safe answer (failurePolicy Ignore turns it into "skip the webhook"),
# so every read is guarded: has() for an absent key, `!= null` for an explicit null (a
# metadata.annotations: null is one converter change away; `'k' in null` errors).
# tests/chart/test_match_conditions.py evaluates each with cel-expr-python (cel-cpp).
matchConditions:
  # Mirror (static) pods belong to the kubelet: never touched. `object` is null on DELETE,
  # and workloads carry no mirror annotation, so the condition holds for them.
  - name: not-a-mirror-pod
    expression: >-
      object == null || !has(object.metadata.annotations) ||
      object.metadata.annotations == null ||
      !('kubernetes.io/config.mirror' in object.metadata.annotations)
  # podmend.io/skip: "all" opts an object out before the request leaves the API server.
  - name: not-skipped
    expression: >-
      object == null || !has(object.metadata.annotations) ||
      object.metadata.annotations == null ||
      !('podmend.io/skip' in object.metadata.annotations) ||
      object.metadata.annotations['podmend.io/skip'] != 'all'
  {{- if .status }}
  # virtual-node-phase acts on Pending pods only: every other pod's status writes (the
  # bulk of them) never leave the API server. `object` is the Pod on UPDATE (null only on
  # DELETE, which this webhook's rule never matches); status is a struct, never null.
  - name: pending-pods-only
    expression: >-
      object != null && has(object.status) && has(object.status.phase) &&
      object.status.phase == 'Pending'
  {{- end }}
{{- end }}
