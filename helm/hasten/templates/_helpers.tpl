{{/*
Names, labels and the shared pieces of every pod.
*/}}

{{- define "hasten.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix: `<release>-hasten`, or the release name when it already says hasten. */}}
{{- define "hasten.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hasten.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "hasten.labels" -}}
helm.sh/chart: {{ include "hasten.chart" . }}
app.kubernetes.io/name: {{ include "hasten.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hasten
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "edge"). */}}
{{- define "hasten.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hasten.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Object names. */}}
{{- define "hasten.controlPlane.name" -}}{{ include "hasten.fullname" . }}-control-plane{{- end }}
{{- define "hasten.controlPlane.headless" -}}{{ include "hasten.fullname" . }}-control-plane-headless{{- end }}
{{- define "hasten.router.name" -}}{{ include "hasten.fullname" . }}-router{{- end }}
{{- define "hasten.edge.name" -}}{{ include "hasten.fullname" . }}-edge{{- end }}
{{- define "hasten.kvOperator.name" -}}{{ include "hasten.fullname" . }}-kv-operator{{- end }}
{{/* (dict "root" $ "shard" 0) */}}
{{- define "hasten.shard.name" -}}{{ include "hasten.fullname" .root }}-shard-{{ .shard }}{{- end }}

{{- define "hasten.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hasten.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hasten.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* host:port for a server to bind. */}}
{{- define "hasten.bind" -}}
{{- printf "%s:%v" .root.Values.bindHost .port }}
{{- end }}

{{/* Fully qualified DNS name of a Service in the release namespace. */}}
{{- define "hasten.svcFqdn" -}}
{{- printf "%s.%s.svc.%s" .service .root.Release.Namespace .root.Values.clusterDomain }}
{{- end }}

{{/* Control-plane pod i's gRPC address: (dict "root" $ "index" 0). */}}
{{- define "hasten.controlPlane.podAddress" -}}
{{- printf "%s-%d.%s:7400" (include "hasten.controlPlane.name" .root) (int .index) (include "hasten.svcFqdn" (dict "root" .root "service" (include "hasten.controlPlane.headless" .root))) }}
{{- end }}

{{/* The TLS name edges expect on the router's certificate. */}}
{{- define "hasten.cloud.serverName" -}}
{{- default (printf "%s.%s.svc" (include "hasten.router.name" .) .Release.Namespace) .Values.tls.cloud.serverName }}
{{- end }}

{{/* Names the router's certificate must carry (generated or dev). */}}
{{- define "hasten.router.dnsNames" -}}
{{- $router := include "hasten.router.name" . -}}
{{- $names := list $router (printf "%s.%s" $router .Release.Namespace) (printf "%s.%s.svc" $router .Release.Namespace) (include "hasten.svcFqdn" (dict "root" . "service" $router)) -}}
{{- if .Values.tls.cloud.serverName }}{{ $names = append $names .Values.tls.cloud.serverName | uniq }}{{ end -}}
{{- toJson $names }}
{{- end }}

{{/* "true" when mutual TLS is on (tls.mutual.secretName or tls.mutual.generate). */}}
{{/* Whether control-plane calls carry the shared token: a control plane without mutual TLS. */}}
{{- define "hasten.controlPlane.tokenEnabled" -}}
{{- if and .Values.controlPlane.enabled (not (include "hasten.mtls.enabled" .)) }}true{{ end }}
{{- end }}

{{/*
How many control-plane nodes founded the group: as the installed release recorded it (an
annotation on the control-plane ConfigMap, read with `lookup`), else
controlPlane.foundingReplicas, else controlPlane.replicas (a first install). Ordinals at or
above it join the group the founders formed instead of founding one.
*/}}
{{- define "hasten.controlPlane.founders" -}}
{{- $existing := lookup "v1" "ConfigMap" .Release.Namespace (include "hasten.controlPlane.name" .) -}}
{{- $recorded := dig "metadata" "annotations" "hasten.io/founding-replicas" "" $existing -}}
{{- if $recorded }}{{ $recorded }}
{{- else if .Values.controlPlane.foundingReplicas }}{{ .Values.controlPlane.foundingReplicas }}
{{- else }}{{ .Values.controlPlane.replicas }}{{ end -}}
{{- end }}

{{/*
The control plane's replicas as the installed release runs them (`lookup`), else
controlPlane.installedReplicas (renderers that cannot read the cluster), else 0 (a first
install).
*/}}
{{- define "hasten.controlPlane.installedReplicas" -}}
{{- $existing := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "hasten.controlPlane.name" .) -}}
{{- if $existing }}{{ dig "spec" "replicas" 0 $existing }}
{{- else }}{{ .Values.controlPlane.installedReplicas | default 0 }}{{ end -}}
{{- end }}

{{/* The Secret holding the control plane's shared token. */}}
{{- define "hasten.controlPlane.tokenSecret" -}}
{{- .Values.controlPlane.auth.secretName | default (printf "%s-control-plane-token" (include "hasten.fullname" .)) }}
{{- end }}

{{/* Where "hasten.baseVolumes" projects the token (with "controlPlaneToken" true). */}}
{{- define "hasten.controlPlane.tokenFile" -}}/etc/hasten/control-plane/token{{- end }}

{{- define "hasten.mtls.enabled" -}}
{{- if or .Values.tls.mutual.secretName .Values.tls.mutual.certManager.enabled .Values.tls.mutual.generate }}true{{ end }}
{{- end }}

{{/* Name of the Secret with the mutual-TLS material (ca.crt, tls.crt, tls.key), empty when off. */}}
{{- define "hasten.mtls.secretName" -}}
{{- if .Values.tls.mutual.secretName }}
{{- .Values.tls.mutual.secretName }}
{{- else if or .Values.tls.mutual.certManager.enabled .Values.tls.mutual.generate }}
{{- include "hasten.fullname" . }}-mtls
{{- end }}
{{- end }}

{{/* The ConfigMap of CAs trusted besides the deployment's (tls.mutual.extraCAs), empty when none. */}}
{{- define "hasten.mtls.extraCaConfigMap" -}}
{{- if and (include "hasten.mtls.enabled" .) .Values.tls.mutual.extraCAs }}
{{- include "hasten.fullname" . }}-mtls-extra-ca
{{- end }}
{{- end }}

{{/*
The mutual-TLS keys of every TOML file, as a JSON object (empty when mutual TLS is off):
the files of the Secret as "hasten.baseVolumes" projects them.
*/}}
{{- define "hasten.mtls.config" -}}
{{- if include "hasten.mtls.enabled" . }}
{{- $files := dict "tls_ca" "/etc/hasten/tls/ca.crt" "tls_cert" "/etc/hasten/tls/tls.crt" "tls_key" "/etc/hasten/tls/tls.key" }}
{{- if include "hasten.mtls.extraCaConfigMap" . }}
{{- $_ := set $files "tls_extra_ca" "/etc/hasten/tls/extra-ca.crt" }}
{{- end }}
{{- toJson $files }}
{{- else }}
{{- "{}" }}
{{- end }}
{{- end }}

{{/*
Names the mutual-TLS certificate must carry: every Service of the release in its short,
namespaced and fully qualified forms, and wildcards for the pods of the headless Services
(the router dials `<shard>-R.<shard>.<ns>.svc.<domain>`, control-plane nodes and edges dial
`<control-plane>-i.<headless>.<ns>.svc.<domain>`), plus `tls.cloud.serverName`.
*/}}
{{- define "hasten.mtls.dnsNames" -}}
{{- $root := . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := include "hasten.router.dnsNames" . | fromJsonArray -}}
{{- $services := list (include "hasten.edge.name" .) (include "hasten.controlPlane.name" .) -}}
{{- $headless := list (include "hasten.controlPlane.headless" .) -}}
{{- range $s := until (int .Values.cloud.shards) }}
{{- $headless = append $headless (include "hasten.shard.name" (dict "root" $root "shard" $s)) -}}
{{- end }}
{{- range $service := concat $services $headless }}
{{- $names = concat $names (list $service (printf "%s.%s" $service $ns) (printf "%s.%s.svc" $service $ns) (include "hasten.svcFqdn" (dict "root" $root "service" $service))) -}}
{{- end }}
{{- /* The KV worker pools the chart renders: the operator names their headless Services after the pools. */}}
{{- if and .Values.kvOperator.enabled .Values.kvPools.enabled }}
{{- range $pool := .Values.kvPools.pools }}
{{- $headless = append $headless $pool.name -}}
{{- end }}
{{- end }}
{{- range $service := $headless }}
{{- $names = concat $names (list (printf "*.%s.%s.svc" $service $ns) (printf "*.%s" (include "hasten.svcFqdn" (dict "root" $root "service" $service)))) -}}
{{- end }}
{{- toJson (uniq $names) }}
{{- end }}

{{/*
Name of the Secret with the cloud's TLS material: the mutual-TLS Secret when mutual TLS is
on (it supersedes tls.cloud), else tls.cloud's; empty in dev-certificate mode.
*/}}
{{- define "hasten.tls.secretName" -}}
{{- if include "hasten.mtls.enabled" . }}
{{- include "hasten.mtls.secretName" . }}
{{- else if .Values.tls.cloud.secretName }}
{{- .Values.tls.cloud.secretName }}
{{- else if .Values.tls.cloud.generate }}
{{- include "hasten.fullname" . }}-cloud-tls
{{- end }}
{{- end }}

{{/*
Checks of values that would otherwise render a deployment that cannot work. Included by
every workload template, so that `helm template` and `helm install` stop with the message.
*/}}
{{- /*
A serving container's preStop hook: it keeps serving for `seconds` after the pod is marked
terminating, while Services and kube-proxy stop routing to it, then the kubelet sends
SIGTERM and the server drains. `sleep` is coreutils' in the image.
*/}}
{{- define "hasten.preStop" -}}
{{- if gt (int .) 0 }}
lifecycle:
  preStop:
    exec:
      command: ["sleep", {{ int . | toString | quote }}]
{{- end }}
{{- end }}

{{- define "hasten.validate" -}}
{{- if and .Values.corpus.bootstrap.onClaim (not (and .Values.corpus.existingClaim .Values.corpus.subPath)) }}
{{- fail "corpus.bootstrap.onClaim builds the bundle into corpus.existingClaim under corpus.subPath: set both (the build renames its output into place, which a claim's root cannot be)" }}
{{- end }}
{{- range $key, $pod := dict "edge" .Values.edge "cloud.router" .Values.cloud.router "cloud.shard" .Values.cloud.shard }}
{{- if ge (int $pod.preStopSeconds) (int $pod.terminationGracePeriodSeconds) }}
{{- fail (printf "%s.preStopSeconds (%v) must be below %s.terminationGracePeriodSeconds (%v): the grace period covers the preStop sleep and the drain after SIGTERM" $key $pod.preStopSeconds $key $pod.terminationGracePeriodSeconds) }}
{{- end }}
{{- end }}
{{- if and (not (include "hasten.mtls.enabled" .)) (not .Values.tls.cloud.secretName) (not .Values.tls.cloud.generate) (not .Values.tls.allowDevCerts) }}
{{- fail "tls: set tls.mutual.secretName (a Secret with ca.crt, tls.crt and tls.key for every component) or tls.mutual.generate=true for mutual TLS, or tls.cloud.secretName (a Secret with tls.crt, tls.key and ca.crt for the router) or tls.cloud.generate=true. Without any, the router generates a dev certificate inside its pod that the edges cannot verify, so the edges cannot start; set tls.allowDevCerts=true only to try the cloud tier and control plane on their own." }}
{{- end }}
{{- if and .Values.tls.mutual.generate (lt (int .Values.tls.mutual.generateValidityDays) 1) }}
{{- fail "tls.mutual.generateValidityDays must be at least 1" }}
{{- end }}
{{- with .Values.edge.kvPool }}
{{- $names := list }}
{{- range $.Values.kvPools.pools }}{{ $names = append $names .name }}{{ end }}
{{- if not (and $.Values.kvOperator.enabled $.Values.kvPools.enabled (has . $names)) }}
{{- fail (printf "edge.kvPool: %q must name a pool of kvPools.pools, with kvOperator.enabled and kvPools.enabled (pools: %s)" . (join ", " $names)) }}
{{- end }}
{{- end }}
{{- if .Values.kvPools.enabled }}
{{- range .Values.kvPools.pools }}
{{- $sha := dig "model" "sha256" "" (.spec | default dict) }}
{{- if and (dig "model" "path" "" (.spec | default dict)) (not (regexMatch "^[0-9a-f]{64}$" $sha)) }}
{{- fail (printf "kvPools.pools[%s].spec.model.sha256: %q is not a SHA-256 (64 lowercase hex digits): set the digest of the model file (`sha256sum %s`); the workers refuse any other file" .name $sha .spec.model.path) }}
{{- end }}
{{- if regexMatch "^0{64}$" $sha }}
{{- fail (printf "kvPools.pools[%s].spec.model.sha256 is the all-zero placeholder: set the digest of the model file (`sha256sum %s`); the workers refuse any other file" .name .spec.model.path) }}
{{- end }}
{{- if and .autoscaling .autoscaling.enabled }}
{{- if not (and (ge (int .autoscaling.minReplicas) 1) (le (int .autoscaling.minReplicas) (int .autoscaling.maxReplicas))) }}
{{- fail (printf "kvPools.pools[%s].autoscaling: minReplicas (%v) must be at least 1 and at most maxReplicas (%v)" .name .autoscaling.minReplicas .autoscaling.maxReplicas) }}
{{- end }}
{{- if and (eq $.Values.edge.kvPool .name) (not (and $.Values.controlPlane.enabled $.Values.kvOperator.publishAssignments)) }}
{{- fail (printf "kvPools.pools[%s].autoscaling: the edges generate on this pool (edge.kvPool), so they must follow its published assignment to reach the workers the autoscaler adds: enable controlPlane and kvOperator.publishAssignments" .name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.tls.mutual.certManager }}
{{- if and .enabled (or $.Values.tls.mutual.secretName $.Values.tls.mutual.generate) }}
{{- fail "tls.mutual.certManager.enabled issues the mutual-TLS Secret itself: leave tls.mutual.secretName empty and tls.mutual.generate false" }}
{{- end }}
{{- if and .enabled (not .issuerRef.name) }}
{{- fail "tls.mutual.certManager.issuerRef.name is required: the cert-manager Issuer or ClusterIssuer (one that fills ca.crt, e.g. a CA issuer) that signs the mutual-TLS certificate" }}
{{- end }}
{{- end }}
{{- with .Values.tls.mutual.extraCAs }}
{{- if not (include "hasten.mtls.enabled" $) }}
{{- fail "tls.mutual.extraCAs adds to the trust of mutual TLS: set tls.mutual.secretName, tls.mutual.certManager.enabled or tls.mutual.generate too" }}
{{- end }}
{{- if not (contains "-----BEGIN CERTIFICATE-----" .) }}
{{- fail "tls.mutual.extraCAs must hold PEM CA certificates (-----BEGIN CERTIFICATE-----), e.g. --set-file tls.mutual.extraCAs=old-ca.crt" }}
{{- end }}
{{- end }}
{{- if .Values.controlPlane.enabled }}
{{- $installed := int (include "hasten.controlPlane.installedReplicas" .) }}
{{- $wanted := int .Values.controlPlane.replicas }}
{{- if lt $wanted 1 }}
{{- fail "controlPlane.replicas: at least 1 (3 tolerates one failure)" }}
{{- end }}
{{- if and (gt $installed $wanted) (lt $wanted (add1 (div $installed 2))) }}
{{- fail (printf "controlPlane.replicas: shrinking from %d to %d nodes at once removes a majority of the group, which then cannot commit the removals; shrink to at least %d in this upgrade and go on in further upgrades" $installed $wanted (add1 (div $installed 2))) }}
{{- end }}
{{- if lt $wanted (int (include "hasten.controlPlane.founders" .)) }}
{{- if and (eq $installed 0) .Values.controlPlane.foundingReplicas }}
{{- fail "controlPlane.foundingReplicas: cannot exceed controlPlane.replicas" }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.edge.autoscaling.enabled (eq .Values.edge.kind "DaemonSet") }}
{{- fail "edge.autoscaling.enabled: a DaemonSet runs one edge per matching node and cannot be autoscaled; use edge.kind=Deployment, or turn autoscaling off" }}
{{- end }}
{{- range $name, $scaling := dict "cloud.router.autoscaling" .Values.cloud.router.autoscaling "edge.autoscaling" .Values.edge.autoscaling }}
{{- if and $scaling.enabled (or (lt (int $scaling.minReplicas) 1) (gt (int $scaling.minReplicas) (int $scaling.maxReplicas))) }}
{{- fail (printf "%s: minReplicas (%v) must be at least 1 and at most maxReplicas (%v)" $name $scaling.minReplicas $scaling.maxReplicas) }}
{{- end }}
{{- end }}
{{- if and .Values.cloud.router.autoscaling.enabled (not (dig "requests" "cpu" "" .Values.cloud.router.resources)) }}
{{- fail "cloud.router.autoscaling.enabled: set cloud.router.resources.requests.cpu, which the CPU target is a share of" }}
{{- end }}
{{- if and .Values.edge.autoscaling.enabled (not (dig "requests" "cpu" "" .Values.edge.resources)) }}
{{- fail "edge.autoscaling.enabled: set edge.resources.requests.cpu, which the CPU target is a share of" }}
{{- end }}
{{- with .Values.edge.lmEngine }}
{{- if .url }}
{{- if not (or (hasPrefix "http://" .url) (hasPrefix "https://" .url)) }}
{{- fail (printf "edge.lmEngine.url: %q is not an http:// or https:// URL" .url) }}
{{- end }}
{{- if not .model }}
{{- fail "edge.lmEngine.model: name the model the engine serves (as its /v1/models lists it)" }}
{{- end }}
{{- if $.Values.edge.kvPool }}
{{- fail "edge.lmEngine.url and edge.kvPool are both set: the edges generate on one of them" }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.edge.tenants.secretName (not .Values.edge.tenants.key) }}
{{- fail "edge.tenants.key: name the key of the Secret edge.tenants.secretName that holds the tenants file (e.g. tenants.toml)" }}
{{- end }}
{{- if lt (int .Values.cloud.shards) 1 }}
{{- fail "cloud.shards must be at least 1" }}
{{- end }}
{{- if lt (int .Values.cloud.replicasPerShard) 1 }}
{{- fail "cloud.replicasPerShard must be at least 1" }}
{{- end }}
{{- if and .Values.controlPlane.enabled (lt (int .Values.controlPlane.replicas) 1) }}
{{- fail "controlPlane.replicas must be at least 1 (3 or 5 for fault tolerance)" }}
{{- end }}
{{- if not (has .Values.edge.kind (list "Deployment" "DaemonSet")) }}
{{- fail (printf "edge.kind must be Deployment or DaemonSet, got %q" .Values.edge.kind) }}
{{- end }}
{{- if not (has .Values.podAntiAffinity (list "soft" "hard" "none")) }}
{{- fail (printf "podAntiAffinity must be soft, hard or none, got %q" .Values.podAntiAffinity) }}
{{- end }}
{{- end }}

{{/* Pod anti-affinity preset: (dict "root" $ "component" "shard-0" "affinity" .Values.x.affinity). */}}
{{- define "hasten.affinity" -}}
{{- if .affinity }}
{{- toYaml .affinity }}
{{- else if eq .root.Values.podAntiAffinity "soft" }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "hasten.selectorLabels" (dict "root" .root "component" .component) | nindent 12 }}
{{- else if eq .root.Values.podAntiAffinity "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "hasten.selectorLabels" (dict "root" .root "component" .component) | nindent 10 }}
{{- end }}
{{- end }}

{{/*
Volumes every pod has: writable scratch, and /etc/hasten with the pod's TOML file and the
TLS material this pod needs under tls/. Under mutual TLS every pod gets the CA, the
certificate and the key. Otherwise, when the cloud has TLS material: the certificate and key
for a server (`"tls" "server"`, the router and shards), the CA for a client (`"tls"
"client"`, the edges). With `"tenants" true` (the edges) and edge.tenants.secretName, the
tenants file as tenants/tenants.toml.
(dict "root" $ "configMap" name "tls" "server"|"client"|"" "tenants" bool)
*/}}
{{- define "hasten.baseVolumes" -}}
- name: tmp
  emptyDir: {}
- name: run
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
- name: config
  projected:
    defaultMode: 0444
    sources:
      - configMap:
          name: {{ .configMap }}
      {{- $secret := include "hasten.tls.secretName" .root }}
      {{- $mutual := include "hasten.mtls.enabled" .root }}
      {{- if and $secret (or $mutual .tls) }}
      - secret:
          name: {{ $secret }}
          items:
            {{- if or $mutual (eq .tls "client") }}
            - key: ca.crt
              path: tls/ca.crt
            {{- end }}
            {{- if or $mutual (eq .tls "server") }}
            - key: tls.crt
              path: tls/tls.crt
            - key: tls.key
              path: tls/tls.key
              mode: 0440
            {{- end }}
      {{- end }}
      {{- with include "hasten.mtls.extraCaConfigMap" .root }}
      - configMap:
          name: {{ . }}
          items:
            - key: ca.crt
              path: tls/extra-ca.crt
      {{- end }}
      {{- if and .controlPlaneToken (include "hasten.controlPlane.tokenEnabled" .root) }}
      - secret:
          name: {{ include "hasten.controlPlane.tokenSecret" .root }}
          items:
            - key: {{ if .root.Values.controlPlane.auth.secretName }}{{ .root.Values.controlPlane.auth.key }}{{ else }}token{{ end }}
              path: control-plane/token
              mode: 0440
      {{- end }}
      {{- if and .tenants .root.Values.edge.lmEngine.url .root.Values.edge.lmEngine.apiKeySecret }}
      - secret:
          name: {{ .root.Values.edge.lmEngine.apiKeySecret }}
          items:
            - key: {{ .root.Values.edge.lmEngine.apiKeySecretKey }}
              path: engine/api-key
              mode: 0440
      {{- end }}
      {{- if and .tenants .root.Values.edge.tenants.secretName }}
      - secret:
          name: {{ .root.Values.edge.tenants.secretName }}
          items:
            - key: {{ .root.Values.edge.tenants.key }}
              path: tenants/tenants.toml
              mode: 0440
      {{- end }}
{{- end }}

{{/*
Checksum of the Secrets "hasten.baseVolumes" mounts for the same arguments, as the cluster
holds them at install or upgrade (`lookup`; names only under `helm template`), for a pod
annotation: an upgrade after a Secret changed (a rotated certificate, new tenants) rolls
the pods that read it, as config changes do. A Secret the chart generates is first seen
with its data at the first upgrade, which therefore rolls those pods once. The extra CAs
(tls.mutual.extraCAs) count too: they come from values, so the new ones are hashed.
*/}}
{{- define "hasten.secretsChecksum" -}}
{{- $root := .root -}}
{{- $seen := list -}}
{{- range $volume := include "hasten.baseVolumes" . | fromYamlArray -}}
{{- range $source := dig "projected" "sources" (list) $volume -}}
{{- with $source.secret -}}
{{- $live := lookup "v1" "Secret" $root.Release.Namespace .name -}}
{{- $seen = append $seen (dict "name" .name "data" (dig "data" (dict) $live)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* The extra CAs come from values: their ConfigMap changes with them. */ -}}
{{- $extra := ternary $root.Values.tls.mutual.extraCAs "" (not (empty (include "hasten.mtls.extraCaConfigMap" $root))) -}}
{{- toJson (dict "secrets" $seen "extraCAs" $extra) | sha256sum -}}
{{- end }}

{{- define "hasten.baseVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: run
  mountPath: /var/run/hasten
- name: config
  mountPath: /etc/hasten
  readOnly: true
{{- end }}

{{/*
The corpus bundle's claim and sub-directory as a dict (`claim`, `subPath`): the release's
`corpus` for the shards; for the edges, `edge.corpus` where set (a corpus update moves the
edges to a new bundle while this release's shards keep serving the old one).
*/}}
{{- define "hasten.edge.corpus" -}}
{{- $claim := default .Values.corpus.existingClaim .Values.edge.corpus.existingClaim }}
{{- $subPath := .Values.corpus.subPath }}
{{- if .Values.edge.corpus.existingClaim }}{{ $subPath = .Values.edge.corpus.subPath }}{{ end }}
{{- dict "claim" $claim "subPath" $subPath | toJson }}
{{- end }}

{{/*
The corpus volume (dict `root`, `claim`, `subPath`): the claim, read-only; without one an
emptyDir that the "corpus" init container fills ("hasten.corpusBootstrap").
*/}}
{{- define "hasten.corpusVolume" -}}
- name: corpus
  {{- if .claim }}
  persistentVolumeClaim:
    claimName: {{ .claim }}
    readOnly: true
  {{- else }}
  emptyDir:
    sizeLimit: {{ .root.Values.corpus.bootstrap.sizeLimit }}
  {{- range .root.Values.corpus.bootstrap.volumes }}
- {{ toYaml . | nindent 2 | trim }}
  {{- end }}
  {{- end }}
{{- end }}

{{- define "hasten.corpusVolumeMount" -}}
- name: corpus
  mountPath: /var/lib/hasten/corpus
  readOnly: true
  {{- if .claim }}
  {{- with .subPath }}
  subPath: {{ . }}
  {{- end }}
  {{- else }}
  subPath: bundle
  {{- end }}
{{- end }}

{{/*
Without a corpus claim (dict `root`, `claim`): the init container that builds the bundle into
the pod's corpus volume, under `bundle/` (the build writes beside it and renames, so a killed
build leaves no half bundle, and a restarted one reuses what was encoded).
*/}}
{{- define "hasten.corpusBootstrap" -}}
{{- if not .claim }}
{{- $root := .root }}
initContainers:
  - name: corpus
    image: {{ include "hasten.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command:
      - cloud-index
      - build
      - --skip-existing
      {{- range $root.Values.corpus.bootstrap.args }}
      - {{ . | quote }}
      {{- end }}
      - --shards
      - {{ $root.Values.cloud.shards | quote }}
      - --out
      - /var/lib/hasten/corpus/bundle
    env:
      {{- include "hasten.commonEnv" $root | nindent 6 }}
    resources:
      {{- toYaml $root.Values.corpus.bootstrap.resources | nindent 6 }}
    securityContext:
      {{- toYaml $root.Values.containerSecurityContext | nindent 6 }}
    volumeMounts:
      - name: corpus
        mountPath: /var/lib/hasten/corpus
      - name: tmp
        mountPath: /tmp
      {{- with $root.Values.corpus.bootstrap.volumeMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by every pod (indented by the caller). */}}
{{- define "hasten.podCommon" -}}
serviceAccountName: {{ include "hasten.serviceAccountName" . }}
{{ include "hasten.podSecurity" . }}
{{- end }}

{{/*
Every pod's settings but its ServiceAccount (a pre-install hook's pod runs before the
release's ServiceAccount exists, so it takes the namespace's default one).
*/}}
{{- define "hasten.podSecurity" -}}
automountServiceAccountToken: false
{{- /*
Service links would put `<SERVICE>_PORT`-style variables into every container; with a
release called hasten they start with HASTEN_EDGE_, HASTEN_ROUTER_... and the binaries read
those prefixes as configuration keys, which deny_unknown_fields rejects.
*/}}
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* Environment every container gets. */}}
{{- define "hasten.commonEnv" -}}
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}

{{/* HTTP probes on one port: (dict "port" "metrics" "startup" .Values.x.startupProbe) */}}
{{- define "hasten.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 6
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- if .startup }}
startupProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: {{ .startup.periodSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
  timeoutSeconds: 3
{{- end }}
{{- end }}

{{/*
A TOML value: strings quoted (JSON escaping is valid TOML for the characters used here),
lists as TOML arrays, numbers and booleans as they are.
*/}}
{{- define "hasten.toml.value" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "slice" . }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "hasten.toml.value" $v }}{{ end }}]
{{- else if kindIs "float64" . }}{{ if eq (float64 (int64 .)) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}{{ . }}
{{- end }}
{{- end }}

{{/*
A map as TOML: its `key = value` lines, sorted, nulls left out, then each nested map as a
`[table]` of its own (TOML puts a table's keys before any sub-table header).
(dict "values" map "floats" list-of-keys-kept-as-floats "prefix" "outer." for a nested call)
*/}}
{{- define "hasten.toml.table" -}}
{{- $floats := default (list) .floats }}
{{- $prefix := default "" .prefix }}
{{- range $key, $value := .values }}
{{- if not (or (kindIs "invalid" $value) (kindIs "map" $value)) }}
{{- if and (has $key $floats) (or (kindIs "float64" $value) (kindIs "int" $value) (kindIs "int64" $value)) }}
{{ $key }} = {{ regexReplaceAll "^(-?[0-9]+)$" (printf "%g" (float64 $value) | replace "e+" "e") "${1}.0" }}
{{- else }}
{{ $key }} = {{ include "hasten.toml.value" $value }}
{{- end }}
{{- end }}
{{- end }}
{{- range $key, $value := .values }}
{{- if kindIs "map" $value }}

[{{ $prefix }}{{ $key }}]
{{- include "hasten.toml.table" (dict "values" $value "floats" $floats "prefix" (printf "%s%s." $prefix $key)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when the prometheus-operator CRDs may be rendered. */}}
{{- define "hasten.monitoring.crds" -}}
{{- if or .Values.monitoring.forceCRDs (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/* PromQL label matchers selecting this release's series. */}}
{{- define "hasten.monitoring.selector" -}}
{{- default (printf "namespace=%q" .Release.Namespace) .Values.monitoring.prometheusRule.selector }}
{{- end }}

{{/*
The keys every binary's configuration takes about its own telemetry: `log_format`, and
`otlp_endpoint` when traces are exported.
*/}}
{{- define "hasten.telemetry" -}}
{{- $telemetry := dict "log_format" .Values.logFormat }}
{{- with .Values.otlpEndpoint }}
{{- $_ := set $telemetry "otlp_endpoint" . }}
{{- end }}
{{- $telemetry | toJson }}
{{- end }}
