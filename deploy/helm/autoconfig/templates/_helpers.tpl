{{/* Names, labels and the RBAC rules shared by the Role and ClusterRole. */}}

{{- define "autoconfig.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "autoconfig.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "autoconfig.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "autoconfig.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "autoconfig.selectorLabels" -}}
app.kubernetes.io/name: {{ include "autoconfig.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "autoconfig.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "autoconfig.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "autoconfig.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Rules for namespaced resources, least privilege. ConfigMaps are never
created (autoconfig writes only into consumers' existing ConfigMaps);
Services are written only for FailOpen fallback Services, behind a toggle.
*/}}
{{- define "autoconfig.namespacedRules" -}}
# Routes: read and watched (cache); patch adds and removes the finalizer
# (a merge patch with resourceVersion). No update, create or delete.
- apiGroups: ["routing.modelsphere.dev"]
  resources: ["modelroutes"]
  verbs: ["get", "list", "watch", "patch"]
# Status: written with one merge patch per reconcile.
- apiGroups: ["routing.modelsphere.dev"]
  resources: ["modelroutes/status"]
  verbs: ["get", "patch"]
# A fallback Service's ownerReference to its route blocks the route's
# deletion (blockOwnerDeletion), which the OwnerReferencesPermission-
# Enforcement admission plugin allows only with update on finalizers.
- apiGroups: ["routing.modelsphere.dev"]
  resources: ["modelroutes/finalizers"]
  verbs: ["update"]
# Output ConfigMaps: read and watched (cache), written with per-key JSON
# patches. Never created, updated whole or deleted.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "patch"]
# Discovery: EndpointSlices of a Service, or Pods by selector, and the
# Services themselves (VIPs, ports, grants).
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch"]
# Scale to zero (spec.scaleToZero): the target's scale subresource (its
# replica count) is written; the workload itself is only read, to check
# that its pod template is the one spec.discovery selects; the other
# autoscalers of a target are read to refuse idleAfter beside them.
- apiGroups: ["apps"]
  resources: ["deployments/scale", "statefulsets/scale"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list"]
# Events on routes (Ready transitions).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
