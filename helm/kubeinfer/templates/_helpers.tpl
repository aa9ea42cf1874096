{{- /* Names and labels every object of the release shares. */}}
{{- define "kubeinfer.operatorName" -}}
{{ .Release.Name }}-operator
{{- end }}

{{- define "kubeinfer.selectorLabels" -}}
app.kubernetes.io/name: kubeinfer
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kubeinfer.labels" -}}
{{ include "kubeinfer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "kubeinfer.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- /*
One operator setting as its environment variable's value: a map as `k=v,k=v` (how
OperatorSettings reads its label maps), a number as JSON (Helm reads numbers as floats,
which Go would print as 3.1536e+07), anything else as it is.
*/}}
{{- define "kubeinfer.settingValue" -}}
{{- if kindIs "map" . -}}
{{- $pairs := list -}}
{{- range $key, $value := . }}{{ $pairs = append $pairs (printf "%s=%v" $key $value) }}{{ end -}}
{{ join "," $pairs }}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{ toJson . }}
{{- else -}}
{{ . }}
{{- end -}}
{{- end }}
