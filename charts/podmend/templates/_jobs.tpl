{{/*
The scheduled maintenance jobs: the report refresh (`podmend audit --cluster --policy-report
--apply`) and the storm clean-up (`podmend clean-storms`). Each is a component of its own:
its own ServiceAccount, its own least-privilege RBAC, its own CronJob.
*/}}

{{/* Object names. A CronJob's name is at most 52 characters (its Jobs add 11): fullname is 40. */}}
{{- define "podmend.reportsName" -}}{{ include "podmend.fullname" . }}-reports{{- end }}
{{- define "podmend.stormsName" -}}{{ include "podmend.fullname" . }}-storms{{- end }}

{{/*
Labels of a component's objects (the jobs here, the node reaper in reaper.yaml). Call with
(dict "ctx" $ "component" "reports"). The pods get no `app.kubernetes.io/name: podmend`: the
webhook's Service, Deployment and PodDisruptionBudget select on it, and a job or reaper pod
must never receive the API server's admission calls.
*/}}
{{- define "podmend.jobLabels" -}}
{{ include "podmend.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "podmend.jobPodLabels" -}}
app.kubernetes.io/name: {{ include "podmend.name" .ctx }}-{{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: podmend
{{- end }}

{{/*
A CronJob running podmend. Call with (dict "ctx" $ "component" "reports" "name" NAME
"job" .Values.reports "args" (list ...)): the job's values carry schedule, timeZone, the
history limits, deadlines, backoffLimit and resources. concurrencyPolicy is always Forbid:
two runs at once would delete or apply the same objects twice.
*/}}
{{- define "podmend.cronJob" -}}
{{- $ctx := .ctx }}
{{- $job := .job -}}
apiVersion: batch/v1
kind: CronJob
metadata:
  name: {{ .name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "podmend.jobLabels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
spec:
  schedule: {{ $job.schedule | quote }}
  {{- with $job.timeZone }}
  timeZone: {{ . | quote }}
  {{- end }}
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: {{ $job.startingDeadlineSeconds }}
  successfulJobsHistoryLimit: {{ $job.successfulJobsHistoryLimit }}
  failedJobsHistoryLimit: {{ $job.failedJobsHistoryLimit }}
  jobTemplate:
    metadata:
      labels:
        {{- include "podmend.jobPodLabels" (dict "ctx" $ctx "component" .component) | nindent 8 }}
    spec:
      backoffLimit: {{ $job.backoffLimit }}
      activeDeadlineSeconds: {{ $job.activeDeadlineSeconds }}
      template:
        metadata:
          labels:
            {{- include "podmend.jobPodLabels" (dict "ctx" $ctx "component" .component) | nindent 12 }}
        spec:
          serviceAccountName: {{ .name }}
          restartPolicy: Never
          {{- with $ctx.Values.imagePullSecrets }}
          imagePullSecrets:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- toYaml $ctx.Values.podSecurityContext | nindent 12 }}
          {{- with $job.nodeSelector }}
          nodeSelector:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $job.tolerations }}
          tolerations:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          containers:
            - name: {{ .component }}
              image: {{ include "podmend.image" $ctx | quote }}
              imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
              args:
                {{- toYaml .args | nindent 16 }}
              env:
                - name: RUST_LOG
                  value: {{ $ctx.Values.logLevel | quote }}
              resources:
                {{- toYaml $job.resources | nindent 16 }}
              securityContext:
                {{- toYaml $ctx.Values.securityContext | nindent 16 }}
{{- end }}

{{/*
The RBAC of a job: a ClusterRole and ClusterRoleBinding for what it does across namespaces,
or, with the job's namespace set, a Role and RoleBinding in that namespace (a RoleBinding
grants only there). Call with (dict "ctx" $ "component" C "name" NAME "namespace" NS
"clusterRules" LIST "namespacedRules" LIST): clusterRules are cluster-scoped resources
(always a ClusterRole), namespacedRules the rest. Rules are YAML text, each a list entry.
*/}}
{{- define "podmend.jobRbac" -}}
{{- $ctx := .ctx }}
{{- $labels := include "podmend.jobLabels" (dict "ctx" $ctx "component" .component) }}
{{- $clusterRules := trim .clusterRules }}
{{- if not .namespace }}
{{- $clusterRules = trim (printf "%s\n%s" .clusterRules .namespacedRules) }}
{{- end }}
{{- if trim $clusterRules }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .name }}
  labels:
    {{- $labels | nindent 4 }}
rules:
  {{- $clusterRules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .name }}
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ $ctx.Release.Namespace }}
{{- end }}
{{- if .namespace }}
---
# Only in {{ .namespace }}: the job audits or cleans that namespace alone.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- $labels | nindent 4 }}
rules:
  {{- .namespacedRules | trim | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ $ctx.Release.Namespace }}
{{- end }}
{{- end }}

{{/* The job's ServiceAccount. Call with (dict "ctx" $ "component" C "name" NAME). */}}
{{- define "podmend.jobServiceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "podmend.jobLabels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
{{- end }}
