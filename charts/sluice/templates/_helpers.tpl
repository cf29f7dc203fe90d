{{/*
The chart's base name: "sluice", or nameOverride.
*/}}
{{- define "sluice.baseName" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 54 | trimSuffix "-" -}}
{{- end -}}

{{/*
The app.kubernetes.io/name label: "sluice-injector" (the example manifests'
name), or nameOverride followed by "-injector".
*/}}
{{- define "sluice.name" -}}
{{- printf "%s-injector" (include "sluice.baseName" .) -}}
{{- end -}}

{{/*
The name of every object: "<release>-injector" when the release's name
contains the base name (release sluice: sluice-injector), else
"<release>-sluice-injector", or fullnameOverride as it is. At most 63
characters, a Service's limit: the release part is cut to leave room for
"-injector".
*/}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $base := include "sluice.baseName" . -}}
{{- $prefix := .Release.Name -}}
{{- if not (contains $base .Release.Name) -}}
{{- $prefix = printf "%s-%s" .Release.Name $base -}}
{{- end -}}
{{- printf "%s-injector" ($prefix | trunc 54 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{/*
The Secret that holds the serving certificate (tls.crt, tls.key) and its CA
(ca.crt): written by the chart, or by cert-manager's Certificate.
*/}}
{{- define "sluice.tlsSecretName" -}}
{{- printf "%s-tls" (include "sluice.fullname" .) -}}
{{- end -}}

{{/*
The Service's DNS name, which the API server checks the serving certificate
against.
*/}}
{{- define "sluice.serviceDNSName" -}}
{{- printf "%s.%s.svc" (include "sluice.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/*
Selector labels: name and instance only, so that they never change on an
upgrade (a Deployment's selector cannot).
*/}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The labels of every object.
*/}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
The injector's image; the sidecar's too unless sidecar.image is set.
*/}}
{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
The namespaces neither webhook reviews pods in: kube-system and the
release's own, always, then webhook.excludeNamespaces. A pod of the
injector's own namespace that waited for the injector could not start while
no injector runs; with failurePolicy Fail, the injector could then never
come back. As a JSON list.
*/}}
{{- define "sluice.excludedNamespaces" -}}
{{- concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq | toJson -}}
{{- end -}}

{{/*
The sidecar's defaults, as `sluice injector` flags: one per sidecar value
that is set. A value left null keeps the injector's own default; the
resource values take "" too, which sets no request or limit. sidecar.image
defaults to the injector's image, so that one chart version pins both.
*/}}
{{- define "sluice.sidecarArgs" -}}
{{- $s := .Values.sidecar -}}
- {{ printf "--image=%s" ($s.image | default (include "sluice.image" .)) | quote }}
{{- range $flag, $v := dict "config-map" $s.configMap "secret" $s.secret "pvc" $s.pvc "grace" $s.grace "jetstream-url" $s.jetstreamURL }}
{{- if $v }}
- {{ printf "--%s=%s" $flag $v | quote }}
{{- end }}
{{- end }}
{{- range $flag, $v := dict "ingest-port" $s.ingestPort "admin-port" $s.adminPort }}
{{- if not (kindIs "invalid" $v) }}
- {{ printf "--%s=%d" $flag ($v | int) | quote }}
{{- end }}
{{- end }}
{{- $r := $s.resources }}
{{- range $flag, $v := dict "cpu-request" $r.requests.cpu "memory-request" $r.requests.memory "cpu-limit" $r.limits.cpu "memory-limit" $r.limits.memory }}
{{- if not (kindIs "invalid" $v) }}
- {{ printf "--%s=%v" $flag $v | quote }}
{{- end }}
{{- end }}
{{- end -}}
