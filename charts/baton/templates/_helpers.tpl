{{/* Chart name, truncated to a label value. */}}
{{- define "baton.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: the release name, or <release>-baton. */}}
{{- define "baton.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "baton.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: baton
{{- end }}

{{- define "baton.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "baton.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "baton.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "baton.workerImage" -}}
{{- default (include "baton.image" .) .Values.workerImage }}
{{- end }}

{{/* The names the API server reaches the webhook's Service by (its certificate's SANs). */}}
{{- define "baton.webhookHosts" -}}
{{- $svc := printf "%s-webhook" (include "baton.fullname" .) -}}
{{ $svc }}.{{ .Release.Namespace }}.svc,{{ $svc }}.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}

{{/* baton server's pods: a component of their own, so no controller selector (its Services,
its PDB) ever takes them in. */}}
{{- define "baton.serverSelectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "baton.serverLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "baton.serverSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: baton
{{- end }}

{{/*
Where workers and the controller reach baton server's ledger (runs kept in PostgreSQL).
*/}}
{{- define "baton.ledgerServer" -}}
{{- if .Values.ledger.serverURL -}}
{{ .Values.ledger.serverURL }}
{{- else -}}
{{ ternary "https" "http" (not (empty .Values.server.tls.secretName)) }}://{{ include "baton.fullname" . }}-server.{{ .Release.Namespace }}.svc:{{ .Values.server.service.port }}
{{- end }}
{{- end }}
