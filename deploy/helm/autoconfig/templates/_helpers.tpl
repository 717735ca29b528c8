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
- apiGroups: ["routing.modelsphere.dev"]
  resources: ["modelroutes"]
  verbs: ["get", "list", "watch", "update", "patch"]
- apiGroups: ["routing.modelsphere.dev"]
  resources: ["modelroutes/status"]
  verbs: ["get", "update", "patch"]
- apiGroups: ["routing.modelsphere.dev"]
  resources: ["modelroutes/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "update", "patch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch"]
{{- if .Values.failOpen.manageFallbackServices }}
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch", "delete"]
{{- end }}
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
