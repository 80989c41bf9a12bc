{{/* The chart's name, or nameOverride. */}}
{{- define "jetbridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name of the release's objects: fullnameOverride, else RELEASE-NAME, else RELEASE when it contains the name. */}}
{{- define "jetbridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "jetbridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels every object carries. */}}
{{- define "jetbridge.labels" -}}
helm.sh/chart: {{ include "jetbridge.chart" . }}
{{ include "jetbridge.selectorLabels" . }}
app.kubernetes.io/version: {{ include "jetbridge.imageTag" . | quote }}
app.kubernetes.io/component: bridge
app.kubernetes.io/part-of: jetbridge
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The labels that select the release's pods (immutable in a Deployment). */}}
{{- define "jetbridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jetbridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "jetbridge.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "jetbridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "jetbridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret the container's environment comes from, or "" for none. */}}
{{- define "jetbridge.secretName" -}}
{{- if .Values.existingSecret -}}
{{- .Values.existingSecret -}}
{{- else if .Values.secretEnv -}}
{{- include "jetbridge.fullname" . -}}
{{- end -}}
{{- end -}}

{{/*
The admin port, from config.admin.listen (HOST:PORT). The probes and
Prometheus reach the pod's IP, so the bridge must listen on every interface:
an empty, loopback or malformed address is refused at render time.
*/}}
{{- define "jetbridge.adminPort" -}}
{{- $listen := toString (dig "admin" "listen" "" (.Values.config | default dict)) -}}
{{- if not (regexMatch "^(0\\.0\\.0\\.0|\\[::\\]|)?:[0-9]{1,5}$" $listen) -}}
{{- fail (printf "config.admin.listen must be 0.0.0.0:PORT, [::]:PORT or :PORT (the kubelet's probes and Prometheus reach the pod's IP), not %q" $listen) -}}
{{- end -}}
{{- $port := regexFind "[0-9]+$" $listen | atoi -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "config.admin.listen: port %d out of range" $port) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/*
"true" when config.admin.tls names a certificate and a key: the bridge then
serves the admin port over HTTPS only, and the probes and the
ServiceMonitor follow. "" without them; one without the other is refused,
as the bridge refuses it.
*/}}
{{- define "jetbridge.adminTLS" -}}
{{- $tls := dig "admin" "tls" dict (.Values.config | default dict) | default dict -}}
{{- $cert := get $tls "cert_file" | default "" | toString -}}
{{- $key := get $tls "key_file" | default "" | toString -}}
{{- if ne (eq $cert "") (eq $key "") -}}
{{- fail "config.admin.tls: cert_file and key_file must be set together (the bridge refuses one without the other)" -}}
{{- end -}}
{{- if $cert -}}true{{- end -}}
{{- end -}}

{{/* config.admin.token as written in the configuration (e.g. ${ADMIN_TOKEN}), or "". */}}
{{- define "jetbridge.adminToken" -}}
{{- dig "admin" "token" "" (.Values.config | default dict) | default "" | toString -}}
{{- end -}}

{{/*
The Secret Prometheus reads config.admin.token from, at key
adminToken.secretKey: the Secret the container's environment comes from
(existingSecret, or the one made from secretEnv). Refuses what would leave
the ServiceMonitor without the token: no such Secret, a secretEnv without
the key, or a token written ${NAME} with NAME another key.
*/}}
{{- define "jetbridge.adminTokenSecret" -}}
{{- $token := include "jetbridge.adminToken" . -}}
{{- $key := .Values.adminToken.secretKey -}}
{{- $secret := include "jetbridge.secretName" . -}}
{{- $why := "config.admin.token is set and serviceMonitor.enabled: Prometheus sends the token from a Secret key" -}}
{{- if not $secret -}}
{{- fail (printf "%s, and no Secret is set: set existingSecret (a Secret with the key %s) or secretEnv.%s" $why $key $key) -}}
{{- end -}}
{{- if and (not .Values.existingSecret) (not (hasKey .Values.secretEnv $key)) -}}
{{- fail (printf "%s, and secretEnv has no key %s (adminToken.secretKey): add it, or set adminToken.secretKey to the key that holds the token" $why $key) -}}
{{- end -}}
{{- if regexMatch "^\\$\\{[A-Za-z_][A-Za-z0-9_]*\\}$" $token -}}
{{- $name := $token | trimPrefix "${" | trimSuffix "}" -}}
{{- if ne $name $key -}}
{{- fail (printf "%s: the bridge reads the token from ${%s}, but the ServiceMonitor would send key %s of Secret %s: set adminToken.secretKey: %s" $why $name $key $secret $name) -}}
{{- end -}}
{{- end -}}
{{- $secret -}}
{{- end -}}

{{/* The name Prometheus verifies the admin certificate for: serviceMonitor.tlsConfig.serverName, or the Service's DNS name. */}}
{{- define "jetbridge.adminServerName" -}}
{{- .Values.serviceMonitor.tlsConfig.serverName | default (printf "%s.%s.svc" (include "jetbridge.fullname" .) .Release.Namespace) -}}
{{- end -}}

{{/* "HTTPS" with config.admin.tls, else "HTTP". */}}
{{- define "jetbridge.adminScheme" -}}
{{- ternary "HTTPS" "HTTP" (eq (include "jetbridge.adminTLS" .) "true") -}}
{{- end -}}

{{/*
config.shutdown_timeout in whole seconds, rounded up (a Go duration such as
30s, 1m30s, 2m or 500ms; absent: the bridge's default, 30s).
*/}}
{{- define "jetbridge.shutdownSeconds" -}}
{{- $d := toString (dig "shutdown_timeout" "30s" (.Values.config | default dict)) -}}
{{- $unit := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|ms|s|m|h)" -}}
{{- if not (regexMatch (printf "^(%s)+$" $unit) $d) -}}
{{- fail (printf "config.shutdown_timeout: %q is not a Go duration such as 30s or 1m30s (the chart derives terminationGracePeriodSeconds from it)" $d) -}}
{{- end -}}
{{- $perUnit := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range $part := regexFindAll $unit $d -1 -}}
{{- $num := regexFind "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" $part -}}
{{- $u := trimPrefix $num $part -}}
{{- $total = addf $total (mulf (float64 $num) (get $perUnit $u)) -}}
{{- end -}}
{{- ceil $total | int -}}
{{- end -}}

{{/*
The bridge configuration file, bridge.yaml, as the ConfigMap holds it. The
pod template's checksum/config annotation is its sha256: the pods roll when
the configuration changes, and only then.
*/}}
{{- define "jetbridge.configFile" -}}
{{- toYaml .Values.config -}}
{{- end -}}
