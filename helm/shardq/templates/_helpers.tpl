{{/* ---------------------------------------------------------------- names and labels */}}

{{- define "shardq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix: <release>-<chart>, or the release name when it already holds the chart name. */}}
{{- define "shardq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "shardq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels. Call with (dict "ctx" $ "component" "coordinator"). */}}
{{- define "shardq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardq.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels. Call with (dict "ctx" $ "component" "coordinator"). */}}
{{- define "shardq.labels" -}}
helm.sh/chart: {{ include "shardq.chart" .ctx }}
{{ include "shardq.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: shardq
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* ---------------------------------------------------------------- names of parts */}}

{{- define "shardq.coordinator.fullname" -}}{{ include "shardq.fullname" . }}-coordinator{{- end -}}
{{- define "shardq.shard.fullname" -}}{{ include "shardq.fullname" . }}-shard{{- end -}}
{{- define "shardq.postgresql.fullname" -}}{{ include "shardq.fullname" . }}-postgresql{{- end -}}

{{/* host:port of the coordinator Service, as workers dial it (and as a TLS certificate names it). */}}
{{- define "shardq.coordinator.address" -}}
{{- printf "%s.%s.svc.%s:%d" (include "shardq.coordinator.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.coordinator.service.port) -}}
{{- end -}}

{{/* Stable address of every shard's Redis, one per line: pod i of the StatefulSet behind its headless Service. */}}
{{- define "shardq.shard.redisAddresses" -}}
{{- $sts := include "shardq.shard.fullname" . -}}
{{- range $i := until (int .Values.shards.count) }}
{{ printf "%s-%d.%s.%s.svc.%s:%d" $sts $i $sts $.Release.Namespace $.Values.clusterDomain (int $.Values.shards.redis.port) }}
{{- end -}}
{{- end -}}

{{/* The address of every shard in the shard map, one per line: its Redis, or with
shards.sentinel.enabled its Sentinel group (sentinel://s0,s1,s2/<shard>-<i>). */}}
{{- define "shardq.shard.addresses" -}}
{{- if .Values.shards.sentinel.enabled -}}
{{- $group := include "shardq.sentinel.group" . -}}
{{- range $i := until (int .Values.shards.count) }}
{{ printf "sentinel://%s/%s" $group (include "shardq.sentinel.master" (dict "ctx" $ "i" $i)) }}
{{- end -}}
{{- else -}}
{{ include "shardq.shard.redisAddresses" . }}
{{- end -}}
{{- end -}}

{{- define "shardq.sentinel.fullname" -}}{{ include "shardq.fullname" . }}-sentinel{{- end -}}

{{/* host:port of every sentinel, comma-separated. */}}
{{- define "shardq.sentinel.group" -}}
{{- $sts := include "shardq.sentinel.fullname" . -}}
{{- $out := list -}}
{{- range $j := until (int .Values.shards.sentinel.sentinels) -}}
{{- $out = append $out (printf "%s-%d.%s.%s.svc.%s:%d" $sts $j $sts $.Release.Namespace $.Values.clusterDomain (int $.Values.shards.sentinel.port)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The name the sentinels monitor shard i's primary under. Call with (dict "ctx" $ "i" i). */}}
{{- define "shardq.sentinel.master" -}}{{ include "shardq.shard.fullname" .ctx }}-{{ .i }}{{- end -}}

{{/* ---------------------------------------------------------------- images */}}

{{/* The shardq image. Call with (dict "ctx" $ "override" .image) where override may be empty. */}}
{{- define "shardq.image" -}}
{{- $img := .ctx.Values.image -}}
{{- $o := .override | default dict -}}
{{- $repo := $o.repository | default $img.repository -}}
{{- if and (not $o.repository) $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (toString ($o.tag | default $img.tag | default .ctx.Chart.AppVersion)) -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- secrets */}}

{{- define "shardq.redis.secretName" -}}
{{- .Values.shards.redis.auth.existingSecret | default (printf "%s-redis" (include "shardq.fullname" .)) -}}
{{- end -}}

{{- define "shardq.redisUsers.secretName" -}}
{{- .Values.shards.redis.aclUsers.existingSecret | default (printf "%s-redis-users" (include "shardq.fullname" .)) -}}
{{- end -}}

{{- define "shardq.workerToken.secretName" -}}
{{- .Values.auth.workerToken.existingSecret | default (printf "%s-worker-token" (include "shardq.fullname" .)) -}}
{{- end -}}

{{- define "shardq.postgresql.secretName" -}}
{{- .Values.postgresql.auth.existingSecret | default (include "shardq.postgresql.fullname" .) -}}
{{- end -}}

{{/*
A generated secret value, base64-encoded, that stays the same across upgrades: the value
already in the cluster when there is one (lookup), else a new random one. Call with
(dict "ctx" $ "name" "<secret>" "key" "<key>" "length" 32).
*/}}
{{- define "shardq.generatedSecretValue" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- $data := dict -}}
{{- if $existing -}}{{- $data = $existing.data | default dict -}}{{- end -}}
{{- if hasKey $data .key -}}
{{- index $data .key -}}
{{- else -}}
{{- randAlphaNum (int .length) | b64enc -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- environment */}}

{{/*
How a coordinator, shard loop or worker logs in to the shards: with shards.redis.aclUsers, as
its role's ACL user (`shardq shards acl`: <keyPrefix>-coordinator, -loop, -worker), so that a
worker's handler code holds no login that can admit jobs, change limits or administer Redis;
else with the default user's password. Call with (dict "ctx" $ "role" "worker").
*/}}
{{- define "shardq.env.redisLogin" -}}
{{- $ := .ctx -}}
{{- if $.Values.shards.redis.aclUsers.enabled -}}
- name: SHARDQ_REDIS_USERNAME
  value: {{ printf "%s-%s" $.Values.keyPrefix .role | quote }}
- name: SHARDQ_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "shardq.redisUsers.secretName" $ }}
      key: {{ .role }}
{{- else -}}
{{ include "shardq.env.redisPassword" $ }}
{{- end -}}
{{- end -}}

{{/*
The init container of a shard's Redis pod that writes its ACL users (hashed passwords) to
/redis-users/users.conf, which redis-server includes (shardq.redis.authConf).
*/}}
{{- define "shardq.redisUsers.initContainer" -}}
- name: redis-users
  image: {{ include "shardq.image" (dict "ctx" .) }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["sh", "-c", "umask 022 && shardq shards acl-conf > /redis-users/users.conf"]
  env:
    - name: SHARDQ_KEY_PREFIX
      value: {{ .Values.keyPrefix | quote }}
    {{- range $role := list "worker" "loop" "coordinator" }}
    - name: SHARDQ_REDIS_PASSWORD_{{ upper $role }}
      valueFrom:
        secretKeyRef:
          name: {{ include "shardq.redisUsers.secretName" $ }}
          key: {{ $role }}
    {{- end }}
  resources:
    {{- toYaml .Values.hooks.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: redis-users
      mountPath: /redis-users
    - name: tmp
      mountPath: /tmp
{{- end -}}

{{- define "shardq.env.redisPassword" -}}
- name: SHARDQ_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "shardq.redis.secretName" . }}
      key: {{ .Values.shards.redis.auth.existingSecretKey }}
{{- end -}}

{{/*
SHARDQ_DATABASE_URL. The bundled Postgres's URL is composed by Kubernetes from its password
Secret ($(VAR) expansion), so that the password exists in one Secret only, generated or yours.
Call with (dict "ctx" $ "hook" true|false): a pre-install hook cannot read the chart's own
Secret (it does not exist yet) and reads the hook copy instead.
*/}}
{{- define "shardq.env.database" -}}
{{- $v := .ctx.Values -}}
{{- if and .role $v.databaseRoles.enabled -}}
{{- /* The process's own role (shardq migrate --roles): see shardq.env.databaseRole. */ -}}
{{ include "shardq.env.databaseRole" . }}
{{- else if $v.postgresql.enabled -}}
- name: SHARDQ_DB_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "shardq.postgresql.secretName" .ctx }}
      key: {{ $v.postgresql.auth.existingSecretKey }}
- name: SHARDQ_DATABASE_URL
  value: {{ printf "postgresql+psycopg://%s:$(SHARDQ_DB_PASSWORD)@%s:5432/%s" $v.postgresql.auth.username (include "shardq.postgresql.fullname" .ctx) $v.postgresql.auth.database | quote }}
{{- else if $v.externalDatabase.existingSecret -}}
- name: SHARDQ_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $v.externalDatabase.existingSecret }}
      key: {{ $v.externalDatabase.existingSecretKey }}
{{- else -}}
- name: SHARDQ_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "shardq.fullname" .ctx }}-database{{ if .hook }}-hook{{ end }}
      key: url
{{- end -}}
{{- end -}}

{{/*
SHARDQ_DATABASE_URL as the role of this process (databaseRoles: the coordinator, a shard loop,
a worker), its password from databaseRoles' Secret: the URL is composed here, so that only
this process's pods get this role's password and none gets the migrator's. Call with
(dict "ctx" $ "role" "worker").
*/}}
{{- define "shardq.env.databaseRole" -}}
{{- $v := .ctx.Values -}}
{{- $r := $v.databaseRoles -}}
{{- $db := ternary $v.postgresql.auth.database $r.database $v.postgresql.enabled -}}
{{- $host := ternary (include "shardq.postgresql.fullname" .ctx) $r.host $v.postgresql.enabled -}}
{{- $port := ternary 5432 (int $r.port) $v.postgresql.enabled -}}
{{- $prefix := $r.prefix | default (printf "%s_" $db) -}}
- name: SHARDQ_DB_ROLE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "shardq.databaseRoles.secretName" .ctx }}
      key: {{ .role }}
- name: SHARDQ_DATABASE_URL
  value: {{ printf "postgresql+psycopg://%s%s:$(SHARDQ_DB_ROLE_PASSWORD)@%s:%d/%s%s" $prefix .role $host $port $db (ternary (printf "?%s" $r.urlParams) "" (ne $r.urlParams "")) | quote }}
{{- end -}}

{{/* `shardq migrate` with --roles when databaseRoles is on: its command and the passwords. */}}
{{- define "shardq.migrate.command" -}}
{{- $r := .Values.databaseRoles -}}
{{- if $r.enabled -}}
["shardq", "migrate", "--roles"{{ with $r.prefix }}, "--role-prefix", {{ . | quote }}{{ end }}]
{{- else -}}
["shardq", "migrate"]
{{- end -}}
{{- end -}}

{{- define "shardq.migrate.env" -}}
{{- if .Values.databaseRoles.enabled -}}
{{- range $role := list "coordinator" "worker" "loop" }}
- name: SHARDQ_DB_PASSWORD_{{ upper $role }}
  valueFrom:
    secretKeyRef:
      name: {{ include "shardq.databaseRoles.secretName" $ }}
      key: {{ $role }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "shardq.databaseRoles.secretName" -}}
{{- .Values.databaseRoles.existingSecret | default (printf "%s-database-roles" (include "shardq.fullname" .)) -}}
{{- end -}}

{{/* The `from` of a metrics port's ingress rule: networkPolicy.metricsFrom, or anyone when it is []. */}}
{{- define "shardq.networkPolicy.metricsFrom" -}}
{{- with .Values.networkPolicy.metricsFrom }}
from:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "shardq.env.common" -}}
- name: SHARDQ_KEY_PREFIX
  value: {{ .Values.keyPrefix | quote }}
- name: SHARDQ_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- with .Values.shards.sentinel }}{{ if .enabled }}
# Every write shardq acknowledges waits for a replica: a failover loses none of them.
- name: SHARDQ_SHARD_REPLICAS_TO_ACK
  value: {{ .replicasToAck | quote }}
- name: SHARDQ_SHARD_REPLICA_ACK_TIMEOUT_MS
  value: {{ .ackTimeoutMs | quote }}
{{- end }}{{ end }}
{{- end -}}

{{/* The four limit keys of coordinator.tenantDefaults, and their names in SHARDQ_TENANT_LIMITS. */}}
{{- define "shardq.tenantLimitKeys" -}}
{{- toYaml (dict "submitRatePerS" "submit_rate_per_s" "submitBurst" "submit_burst" "maxPending" "max_pending" "maxPendingBytes" "max_pending_bytes") -}}
{{- end -}}

{{/*
coordinator.tenantDefaults as the JSON the coordinator reads from SHARDQ_TENANT_LIMITS
(coordinator/limits.py, parse_tenant_limits): `everyone` is the "*" entry, each tenant its own.
Empty when nothing is set, so that the variable is left out.
*/}}
{{- define "shardq.coordinator.tenantLimits" -}}
{{- $names := include "shardq.tenantLimitKeys" . | fromYaml -}}
{{- $td := .Values.coordinator.tenantDefaults -}}
{{- $entries := dict -}}
{{- with $td.everyone }}{{ $_ := set $entries "*" . }}{{ end -}}
{{- range $tenant, $e := $td.tenants }}{{ $_ := set $entries $tenant ($e | default dict) }}{{ end -}}
{{- $doc := dict -}}
{{- range $tenant, $e := $entries -}}
{{- $out := dict -}}
{{- range $k, $val := $e -}}
{{- $_ := set $out (get $names $k) $val -}}
{{- end -}}
{{- $_ := set $doc $tenant $out -}}
{{- end -}}
{{- if $doc }}{{ toJson $doc }}{{ end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- pod parts */}}

{{- define "shardq.podSpecCommon" -}}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/*
Node placement of a component's pods: nodeSelector, tolerations, affinity and
topologySpreadConstraints. Call with (dict "ctx" $ "component" "coordinator" "v" <its values>
"defaults" <values its presets default to, optional> "peers" <more label sets, optional>).

- affinity: the component's `affinity` when set (it replaces the preset, whole); else the
  `podAntiAffinityPreset`: `soft` prefers, `hard` requires, one pod of the component per node
  (kubernetes.io/hostname); `none` sets nothing. Losing a node then takes one coordinator or
  one shard, not several. Each of `peers` (matchLabels) is kept off the pod's node the same way:
  a shard's replicas name their primary and each other, so no node holds two copies of a shard.
- topologySpreadConstraints: the component's `topologySpreadConstraints` when not empty (each
  one without a labelSelector gets the component's); else the `zoneSpreadPreset`: `soft`
  (ScheduleAnyway) or `hard` (DoNotSchedule) spreads the pods over topology.kubernetes.io/zone
  with a skew of 1; `none` sets nothing. `soft` also schedules on nodes without a zone label.
*/}}
{{- define "shardq.placement" -}}
{{- $v := .v -}}
{{- $d := .defaults | default dict -}}
{{- $selector := include "shardq.selectorLabels" (dict "ctx" .ctx "component" .component) | fromYaml -}}
{{- $anti := ternary $v.podAntiAffinityPreset ($d.podAntiAffinityPreset | default "none") (hasKey $v "podAntiAffinityPreset") -}}
{{- $zone := ternary $v.zoneSpreadPreset ($d.zoneSpreadPreset | default "none") (hasKey $v "zoneSpreadPreset") -}}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $v.affinity }}
affinity:
  {{- toYaml $v.affinity | nindent 2 }}
{{- else if eq $anti "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      {{- range (prepend (.peers | default list) $selector) }}
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- toYaml . | nindent 14 }}
      {{- end }}
{{- else if eq $anti "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      {{- range (prepend (.peers | default list) $selector) }}
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- toYaml . | nindent 12 }}
      {{- end }}
{{- end }}
{{- if $v.topologySpreadConstraints }}
{{- $constraints := list }}
{{- range $v.topologySpreadConstraints }}
{{- $constraints = append $constraints (ternary . (merge (dict "labelSelector" (dict "matchLabels" $selector)) .) (hasKey . "labelSelector")) }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $constraints | nindent 2 }}
{{- else if ne $zone "none" }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: {{ ternary "DoNotSchedule" "ScheduleAnyway" (eq $zone "hard") }}
    labelSelector:
      matchLabels:
        {{- toYaml $selector | nindent 8 }}
{{- end }}
{{- end -}}

{{/* The queues of a worker group, comma-separated (SHARDQ_QUEUES). Call with the group's values. */}}
{{- define "shardq.workerQueues" -}}
{{- join "," (.queues | default (list "default")) -}}
{{- end -}}

{{/*
The PodDisruptionBudget of a worker group, as YAML {enabled, minAvailable, maxUnavailable, from}
(the budgets as strings, "" when not set; `from` names the values they come from): the group's
`pdb` over workers.pdb, where a group that gives either budget replaces both; maxUnavailable 1
when neither is given. Call with (dict "group" $g "workers" .Values.workers "where" "...").
*/}}
{{- define "shardq.workerPdb" -}}
{{- $w := .workers.pdb | default dict -}}
{{- $gp := .group.pdb | default dict -}}
{{- $src := $w -}}
{{- $from := "workers.pdb" -}}
{{- if or (hasKey $gp "minAvailable") (hasKey $gp "maxUnavailable") -}}
{{- $src = $gp -}}
{{- $from = printf "%s.pdb" .where -}}
{{- end -}}
{{- $out := dict "enabled" (ternary $gp.enabled $w.enabled (hasKey $gp "enabled")) "minAvailable" "" "maxUnavailable" "" "from" $from -}}
{{- range $k := list "minAvailable" "maxUnavailable" -}}
{{- $val := get $src $k -}}
{{- if not (kindIs "invalid" $val) -}}{{- $_ := set $out $k (toString $val) -}}{{- end -}}
{{- end -}}
{{- if not (or $out.minAvailable $out.maxUnavailable) -}}{{- $_ := set $out "maxUnavailable" "1" -}}{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* ---------------------------------------------------------------- validation */}}

{{/*
Checks what the schema cannot (relations between values, and the cluster's current state),
collects every problem and fails once, listing all of them.
*/}}
{{- define "shardq.validateValues" -}}
{{- $v := .Values -}}
{{- $p := list -}}
{{- if lt (int $v.shards.count) 1 -}}
{{- $p = append $p (printf "shards.count: must be at least 1 (got %v)" $v.shards.count) -}}
{{- end -}}
{{- if $v.postgresql.enabled -}}
{{- if or $v.externalDatabase.existingSecret $v.externalDatabase.url -}}
{{- $p = append $p "externalDatabase: set either postgresql.enabled or externalDatabase, not both" -}}
{{- end -}}
{{- else -}}
{{- if and $v.externalDatabase.existingSecret $v.externalDatabase.url -}}
{{- $p = append $p "externalDatabase: set either externalDatabase.existingSecret or externalDatabase.url, not both" -}}
{{- else if not (or $v.externalDatabase.existingSecret $v.externalDatabase.url) -}}
{{- $p = append $p "externalDatabase: no database secret: set externalDatabase.existingSecret (a Secret with the postgresql+psycopg URL under externalDatabase.existingSecretKey), or externalDatabase.url, or postgresql.enabled=true" -}}
{{- end -}}
{{- if and $v.externalDatabase.url (not (regexMatch "^postgresql(\\+psycopg)?://" $v.externalDatabase.url)) -}}
{{- $p = append $p "externalDatabase.url: must start with postgresql+psycopg://" -}}
{{- end -}}
{{- end -}}
{{- if not $v.generateSecrets -}}
{{- /* GitOps (helm template, Argo CD, Flux): lookup sees no cluster, so a generated secret
would be new at every render. Every credential must then come from a Secret of your own. */ -}}
{{- $missing := list -}}
{{- if not $v.shards.redis.auth.existingSecret }}{{ $missing = append $missing "shards.redis.auth.existingSecret" }}{{ end -}}
{{- if not $v.auth.workerToken.existingSecret }}{{ $missing = append $missing "auth.workerToken.existingSecret" }}{{ end -}}
{{- if and $v.postgresql.enabled (not $v.postgresql.auth.existingSecret) }}{{ $missing = append $missing "postgresql.auth.existingSecret" }}{{ end -}}
{{- if and $v.shards.redis.aclUsers.enabled (not $v.shards.redis.aclUsers.existingSecret) }}{{ $missing = append $missing "shards.redis.aclUsers.existingSecret" }}{{ end -}}
{{- if and $v.databaseRoles.enabled (not $v.databaseRoles.existingSecret) }}{{ $missing = append $missing "databaseRoles.existingSecret" }}{{ end -}}
{{- if $missing -}}
{{- $p = append $p (printf "generateSecrets=false: name a Secret of your own for %s (a generated one would change at every render without a cluster to read it back from)" (join ", " $missing)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.databaseRoles.enabled (not $v.postgresql.enabled) (not (and $v.databaseRoles.host $v.databaseRoles.database)) -}}
{{- $p = append $p "databaseRoles: with an external database, set databaseRoles.host and databaseRoles.database (each process's URL is composed from them and its role's password)" -}}
{{- end -}}
{{- if and $v.tls.enabled (not $v.tls.existingSecret) -}}
{{- $p = append $p "tls.existingSecret: required when tls.enabled (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- if and $v.tls.clientAuth (not $v.tls.enabled) -}}
{{- $p = append $p "tls.clientAuth: requires tls.enabled" -}}
{{- end -}}
{{- if $v.tls.clientAuth -}}
{{- /* The coordinator then refuses a worker without a certificate: it would never get a shard. */ -}}
{{- $uncertified := list -}}
{{- range $g := $v.workers.groups -}}
{{- if not ($g.clientCertSecret | default $v.workers.clientCertSecret) -}}
{{- $uncertified = append $uncertified $g.name -}}
{{- end -}}
{{- end -}}
{{- if $uncertified -}}
{{- $p = append $p (printf "workers.clientCertSecret: required with tls.clientAuth (the coordinator refuses workers without a client certificate; groups without one: %s): a kubernetes.io/tls Secret whose tls.crt/tls.key are signed by the ca.crt of tls.existingSecret, or a group's clientCertSecret" (join ", " $uncertified)) -}}
{{- end -}}
{{- end -}}
{{- $ca := $v.coordinator.autoscaling -}}
{{- if and $ca.enabled (gt (int $ca.minReplicas) (int $ca.maxReplicas)) -}}
{{- $p = append $p (printf "coordinator.autoscaling: minReplicas (%v) is above maxReplicas (%v)" $ca.minReplicas $ca.maxReplicas) -}}
{{- end -}}
{{- if $v.coordinator.pdb.enabled -}}
{{- $least := ternary $ca.minReplicas $v.coordinator.replicaCount $ca.enabled -}}
{{- if ge (int $v.coordinator.pdb.minAvailable) (int $least) -}}
{{- $p = append $p (printf "coordinator.pdb.minAvailable (%v) must be below the coordinator's replicas (%v), or no node could ever be drained" $v.coordinator.pdb.minAvailable $least) -}}
{{- end -}}
{{- end -}}
{{- /* Typed values own their variables: the same name in extraEnv would silently win. */ -}}
{{- $owned := dict "SHARDQ_TENANT_LIMITS" "coordinator.tenantDefaults" "SHARDQ_REJECT_UNKNOWN_HANDLERS" "coordinator.rejectUnknownHandlers" "SHARDQ_TOKEN_CACHE_TTL_S" "coordinator.tokenCache.ttlSeconds" "SHARDQ_TOKEN_STALE_MAX_S" "coordinator.tokenCache.staleMaxSeconds" -}}
{{- range $i, $e := $v.coordinator.extraEnv -}}
{{- with get $owned (toString $e.name) -}}
{{- $p = append $p (printf "coordinator.extraEnv[%d]: %s is set from %s; set that value instead" $i $e.name .) -}}
{{- end -}}
{{- end -}}
{{- $limitKeys := include "shardq.tenantLimitKeys" . | fromYaml -}}
{{- $td := $v.coordinator.tenantDefaults | default dict -}}
{{- $tdEntries := dict "everyone" ($td.everyone | default dict) -}}
{{- range $tenant, $e := ($td.tenants | default dict) -}}
{{- if not (regexMatch "^[A-Za-z0-9._-]{1,64}$" $tenant) -}}
{{- $p = append $p (printf "coordinator.tenantDefaults.tenants: %q is not a tenant ID ([A-Za-z0-9._-]{1,64})" $tenant) -}}
{{- end -}}
{{- $_ := set $tdEntries (printf "tenants.%s" $tenant) ($e | default dict) -}}
{{- end -}}
{{- range $where, $e := $tdEntries -}}
{{- range $k, $val := $e -}}
{{- if not (hasKey $limitKeys $k) -}}
{{- $p = append $p (printf "coordinator.tenantDefaults.%s.%s: not a default limit (submitRatePerS, submitBurst, maxPending, maxPendingBytes; the weight and maxActive are set per tenant with `shardq tenants set`)" $where $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $seen := dict -}}
{{- $queueOwners := dict -}}
{{- range $i, $g := $v.workers.groups -}}
{{- $where := printf "workers.groups[%d]" $i -}}
{{- if not $g.name -}}
{{- $p = append $p (printf "%s.name: required" $where) -}}
{{- else -}}
{{- $where = printf "workers.groups[%d] (%s)" $i $g.name -}}
{{- if hasKey $seen (toString $g.name) -}}
{{- $p = append $p (printf "%s.name: duplicate worker group name" $where) -}}
{{- end -}}
{{- $_ := set $seen (toString $g.name) true -}}
{{- end -}}
{{- if not $g.handlers -}}
{{- $p = append $p (printf "%s.handlers: required (the Python module with the group's handlers)" $where) -}}
{{- end -}}
{{- $as := $g.autoscaling | default dict -}}
{{- if and $as.enabled (gt (int ($as.minReplicas | default 1)) (int ($as.maxReplicas | default 10))) -}}
{{- $p = append $p (printf "%s.autoscaling: minReplicas is above maxReplicas" $where) -}}
{{- end -}}
{{- $pdb := include "shardq.workerPdb" (dict "group" $g "workers" $v.workers "where" $where) | fromYaml -}}
{{- if $pdb.enabled -}}
{{- $least := ternary $g.replicaCount 2 (hasKey $g "replicaCount") -}}
{{- if $as.enabled }}{{ $least = $as.minReplicas | default 1 }}{{ end -}}
{{- if and $pdb.minAvailable $pdb.maxUnavailable -}}
{{- $p = append $p (printf "%s: set minAvailable or maxUnavailable, not both (for %s)" $pdb.from $where) -}}
{{- else if or (eq $pdb.maxUnavailable "0") (eq $pdb.maxUnavailable "0%") -}}
{{- $p = append $p (printf "%s.maxUnavailable: 0 would block every node drain (for %s)" $pdb.from $where) -}}
{{- else if eq $pdb.minAvailable "100%" -}}
{{- $p = append $p (printf "%s.minAvailable: 100%% would block every node drain (for %s)" $pdb.from $where) -}}
{{- else if and $pdb.minAvailable (regexMatch "^[0-9]+$" $pdb.minAvailable) (gt (int $least) 0) (ge (int $pdb.minAvailable) (int $least)) -}}
{{- $p = append $p (printf "%s.minAvailable (%s) must be below the replicas of %s (%v), or no node could ever be drained" $pdb.from $pdb.minAvailable $where $least) -}}
{{- end -}}
{{- end -}}
{{- /* A worker hands back the jobs it has no handler for: two groups with different handler
modules on one queue pass each other's jobs back and forth. Allowed only when asked for. */ -}}
{{- range $q := splitList "," (include "shardq.workerQueues" $g) -}}
{{- $first := index $queueOwners $q -}}
{{- if not (regexMatch "^[A-Za-z0-9._-]{1,64}$" $q) -}}
{{- $p = append $p (printf "%s.queues: %q is not a queue name ([A-Za-z0-9._-]{1,64})" $where $q) -}}
{{- else if not $first -}}
{{- $_ := set $queueOwners $q (dict "where" $where "handlers" (toString $g.handlers)) -}}
{{- else if and (ne $first.handlers (toString $g.handlers)) (not $v.workers.allowSharedQueues) -}}
{{- $p = append $p (printf "%s.queues: queue %q is also served by %s with other handlers (%s vs %s): each group's workers would hand the other's jobs back. Give each group its own queues, or set workers.allowSharedQueues=true" $where $q $first.where $first.handlers (toString $g.handlers)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $mv := $v.hooks.moves -}}
{{- if and $mv.enabled (ge (int $mv.activeWaitSeconds) (int $mv.activeDeadlineSeconds)) -}}
{{- $p = append $p (printf "hooks.moves.activeWaitSeconds (%v) must be below hooks.moves.activeDeadlineSeconds (%v), or the moves Job is killed while the mover still waits" $mv.activeWaitSeconds $mv.activeDeadlineSeconds) -}}
{{- end -}}
{{- /* Shrinking would orphan the jobs of shards still in the map: refuse it unless the operator
says those shards were drained and removed (lookup is empty in `helm template`). */ -}}
{{- $sts := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "shardq.shard.fullname" .) -}}
{{- if and $sts $sts.spec (not $v.shards.allowShrink) -}}
{{- if lt (int $v.shards.count) (int $sts.spec.replicas) -}}
{{- $p = append $p (printf "shards.count: cannot shrink from %v to %v shards (their slots and jobs would be lost). Drain, move and remove shards %v..%v first (`shardq shards drain`, `shardq moves run`, `shardq shards remove`, highest ID first), then upgrade with shards.allowShrink=true" $sts.spec.replicas $v.shards.count $v.shards.count (sub (int $sts.spec.replicas) 1)) -}}
{{- end -}}
{{- end -}}
{{- if $p -}}
{{- fail (printf "\n\nVALUES VALIDATION (%d problem(s)):\n  - %s\n" (len $p) (join "\n  - " $p)) -}}
{{- end -}}
{{- end -}}

{{/* The end of a hook Job's container: resources, security context, /tmp. */}}
{{- define "shardq.hookContainerRest" -}}
resources:
  {{- toYaml .Values.hooks.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.containerSecurityContext | nindent 2 }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
{{- end -}}

{{/*
Init container of the shard-map hooks: waits until every shard's Redis answers PING with the
password (not only accepts connections: a Redis loading its AOF answers LOADING). After an
upgrade that raises shards.count the new shard pods may still be starting; the Job's
activeDeadlineSeconds bounds the wait. Python and redis-py from the shardq image.
*/}}
{{- define "shardq.hook.waitForShards" -}}
- name: wait-for-shards
  image: {{ include "shardq.image" (dict "ctx" $) }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - python
    - -c
    - |
      import os, sys, time
      import redis
      from redis.backoff import NoBackoff
      from redis.retry import Retry
      password = os.environ.get("SHARDQ_REDIS_PASSWORD") or None
      for address in sys.argv[1:]:
          host, _, port = address.rpartition(":")
          client = redis.Redis(host=host, port=int(port), password=password,
                               socket_connect_timeout=2, socket_timeout=2,
                               retry=Retry(NoBackoff(), 0))
          while True:
              try:
                  if client.ping():
                      break
              except redis.RedisError as exc:
                  print(f"waiting for shard {address}: {exc}", flush=True)
              time.sleep(2)
          print(f"shard {address} is up", flush=True)
    {{- range $addr := splitList "\n" (include "shardq.shard.redisAddresses" . | trim) }}
    - {{ $addr | quote }}
    {{- end }}
  env:
    {{- include "shardq.env.redisPassword" . | nindent 4 }}
  {{- include "shardq.hookContainerRest" . | nindent 2 }}
{{- end -}}

{{/* Pods allowed to reach the shards' Redis and the bundled Postgres. */}}
{{- define "shardq.networkPolicy.clients" -}}
- podSelector:
    matchLabels:
      {{- include "shardq.selectorLabels" (dict "ctx" .ctx "component" "coordinator") | nindent 6 }}
- podSelector:
    matchLabels:
      app.kubernetes.io/instance: {{ .ctx.Release.Name }}
      shardq.io/role: worker
- podSelector:
    matchLabels:
      {{- include "shardq.selectorLabels" (dict "ctx" .ctx "component" "shards-sync") | nindent 6 }}
{{- if .ctx.Values.hooks.moves.enabled }}
- podSelector:
    matchLabels:
      {{- include "shardq.selectorLabels" (dict "ctx" .ctx "component" "moves") | nindent 6 }}
{{- end }}
{{- if .migrate }}
- podSelector:
    matchLabels:
      {{- include "shardq.selectorLabels" (dict "ctx" .ctx "component" "migrate") | nindent 6 }}
{{- end }}
{{- end -}}
