{{/* The objects' name: himitsu-operator, as deploy/ names them, unless fullnameOverride.
Every cluster-scoped object's name and the Lease's start with it: a second release with
another fullnameOverride shares nothing with the first. */}}
{{- define "himitsu.fullname" -}}
{{- default "himitsu-operator" .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "himitsu.selectorLabels" -}}
app.kubernetes.io/name: himitsu-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "himitsu.labels" -}}
app.kubernetes.io/name: himitsu-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: himitsu
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The rules of a role file copied from deploy/ (`make chart-sync`): one truth. */}}
{{- define "himitsu.rulesOf" -}}
{{- $doc := .root.Files.Get .file | fromYaml -}}
{{- if not $doc.rules -}}
{{- fail (printf "%s is missing from the chart: run `make chart-sync`" .file) -}}
{{- end -}}
{{- toYaml $doc.rules -}}
{{- end -}}

{{/* allowedApiUrls, required: where tokens may be sent. */}}
{{- define "himitsu.allowedApiUrls" -}}
{{- $urls := .Values.allowedApiUrls | default list -}}
{{- if kindIs "string" $urls }}{{ $urls = splitList "," $urls }}{{ end -}}
{{- if not $urls -}}
{{- fail "allowedApiUrls is required: the Himitsu API URL(s) the operator may send tokens to, e.g. --set allowedApiUrls=https://himitsu.example.com (several: --set 'allowedApiUrls={https://a.example.com,https://b.example.com}')" -}}
{{- end -}}
{{- range $urls -}}
{{- if not (regexMatch "^https?://[^\\s,]+$" .) -}}
{{- fail (printf "allowedApiUrls: %q is not an http(s) URL (one URL per item, no commas)" .) -}}
{{- end -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* The leader-election Lease's name: leaderElection.id, else <fullname>.himitsu.io. */}}
{{- define "himitsu.leaseName" -}}
{{- default (printf "%s.himitsu.io" (include "himitsu.fullname" .)) .Values.leaderElection.id -}}
{{- end -}}

{{/* An image reference: repository@digest, else repository:tag (appVersion by default). */}}
{{- define "himitsu.image" -}}
{{- with .Values.image -}}
{{- if .digest -}}{{ .repository }}@{{ .digest }}
{{- else -}}{{ .repository }}:{{ .tag | default $.Chart.AppVersion }}
{{- end -}}
{{- end -}}
{{- end -}}
