{{/* The objects' name: fullnameOverride, else the release's name (mbuild deploy names it after the model). */}}
{{- define "mbuild.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mbuild.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mbuild.fullname" . }}
{{- end -}}

{{/* mbuild's labels (task, profile id) from the build, and Helm's own. */}}
{{- define "mbuild.labels" -}}
{{ include "mbuild.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* By digest where one is given: a digest names one image for ever, a tag may move. */}}
{{- define "mbuild.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ required "image.tag or image.digest is required" .Values.image.tag }}
{{- end -}}
{{- end -}}

{{- define "mbuild.apiKeySecret" -}}
{{- default (printf "%s-api-key" (include "mbuild.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}
