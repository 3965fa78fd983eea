{{/* The release's name for its objects: the release name, with the chart's name unless it holds it. */}}
{{- define "deviceplugin.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "deviceplugin.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The pods of the device plugin's DaemonSet. */}}
{{- define "deviceplugin.selector" -}}
app.kubernetes.io/name: deviceplugin
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The pods of the DRA driver's DaemonSet. */}}
{{- define "deviceplugin.draSelector" -}}
app.kubernetes.io/name: deviceplugin-dra
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The ConfigMap of named configs: config.name, or the chart's own from config.map; "" for none. */}}
{{- define "deviceplugin.configMap" -}}
{{- if and .Values.config.name (gt (len .Values.config.map) 0) -}}
{{- fail "config.name and config.map are both set: give the configs inline (map) or name an existing ConfigMap (name), not both" -}}
{{- end -}}
{{- if .Values.config.name -}}
{{- .Values.config.name -}}
{{- else if gt (len .Values.config.map) 0 -}}
{{- if and .Values.config.default (not (hasKey .Values.config.map .Values.config.default)) -}}
{{- fail (printf "config.default %q is not a key of config.map (%s)" .Values.config.default (keys .Values.config.map | sortAlpha | join ", ")) -}}
{{- end -}}
{{- if and (not .Values.config.default) (gt (len .Values.config.map) 1) (not (hasKey .Values.config.map "default")) -}}
{{- fail "config.map holds several configs and config.default is empty: name the config of nodes without the nvidia.com/device-plugin.config label" -}}
{{- end -}}
{{- printf "%s-configs" (include "deviceplugin.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The config every node without the label gets, when the chart knows it; "" otherwise. */}}
{{- define "deviceplugin.defaultConfig" -}}
{{- if .Values.config.default -}}
{{- .Values.config.default -}}
{{- else if hasKey .Values.config.map "default" -}}
default
{{- else if eq (len .Values.config.map) 1 -}}
{{- keys .Values.config.map | first -}}
{{- end -}}
{{- end -}}

{{/* Whether the device plugin talks to the API server (its own Node): named configs or GPU labels. */}}
{{- define "deviceplugin.followsNode" -}}
{{- if or (include "deviceplugin.configMap" .) .Values.gpuLabels.enabled -}}true{{- end -}}
{{- end -}}

{{/* MIG monitoring (and SYS_ADMIN) where some config may ask for MIG devices: migStrategy single
or mixed, or, with migStrategy unset, a config of config.map that sets either, or an external
ConfigMap (its configs are not known here); migMonitoring forces it. */}}
{{- define "deviceplugin.migMonitoring" -}}
{{- $on := or .Values.migMonitoring (has (toString .Values.migStrategy) (list "single" "mixed")) -}}
{{- if and (not $on) (kindIs "invalid" .Values.migStrategy) -}}
{{- $on = not (empty .Values.config.name) -}}
{{- range $name, $text := .Values.config.map -}}
{{- $flags := (fromYaml $text).flags | default dict -}}
{{- if has (toString $flags.migStrategy) (list "single" "mixed") -}}
{{- $on = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/* The label keys the device plugin writes: deviceplugin/model/gpulabels.py `owned()`, and
gpu.slices.gi/ci, which it writes under migStrategy single (an RE2 expression for CEL's
matches(), anchored: `[.]` is a dot, no backslash to escape). nvidia.com/device-plugin.config is
not one of them: the operator sets that one. */}}
{{- define "deviceplugin.ownedLabelKeys" -}}
^nvidia[.]com/(gpu[.](present|product|count|memory|family|compute[.]major|compute[.]minor|replicas|sharing-strategy|slices[.]gi|slices[.]ci)|mig[.](strategy|capable)|mig-[^/]+[.](product|count|replicas|sharing-strategy|memory|slices[.]gi|slices[.]ci)|cuda[.]driver-version[.](major|minor|revision|full))$
{{- end -}}

{{/* The user name of a service account's tokens: the argument is the account's name. */}}
{{- define "deviceplugin.tokenUser" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:{{ .name }}
{{- end -}}

{{/* A DaemonSet's affinity: .Values.affinity, and with migration.modeLabel set, the expression
`<label> NotIn ["true"]` (the device plugin) or `<label> Exists` (the DRA driver) ANDed into each
of its required node selector terms (the terms are ORed, so every one must carry it; none given,
it is the only term). The argument is a dict: root (the chart's context) and operator. So only
the DRA driver serves a node labelled "true"; on one labelled "false" (moved back) the driver
stays beside the device plugin to release the claims it prepared, and publishes nothing. */}}
{{- define "deviceplugin.affinity" -}}
{{- $affinity := deepCopy (.root.Values.affinity | default dict) -}}
{{- with .root.Values.migration.modeLabel -}}
{{- $expression := dict "key" . "operator" $.operator -}}
{{- if eq $.operator "NotIn" }}{{ $_ := set $expression "values" (list "true") }}{{ end -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := list -}}
{{- range get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $terms = append $terms (set . "matchExpressions" (append (get . "matchExpressions" | default list) $expression)) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ = set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- with $affinity }}{{ toYaml . }}{{ end -}}
{{- end -}}
