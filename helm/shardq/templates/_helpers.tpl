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

{{/* Stable address of every shard, one per line: pod i of the StatefulSet behind its headless Service. */}}
{{- define "shardq.shard.addresses" -}}
{{- $sts := include "shardq.shard.fullname" . -}}
{{- range $i := until (int .Values.shards.count) }}
{{ printf "%s-%d.%s.%s.svc.%s:%d" $sts $i $sts $.Release.Namespace $.Values.clusterDomain (int $.Values.shards.redis.port) }}
{{- end -}}
{{- end -}}

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
{{- if $v.postgresql.enabled -}}
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

{{- define "shardq.env.common" -}}
- name: SHARDQ_KEY_PREFIX
  value: {{ .Values.keyPrefix | quote }}
- name: SHARDQ_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
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

{{/* Node placement. Call with the component's values. */}}
{{- define "shardq.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The queues of a worker group, comma-separated (SHARDQ_QUEUES). Call with the group's values. */}}
{{- define "shardq.workerQueues" -}}
{{- join "," (.queues | default (list "default")) -}}
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
{{- if and $v.tls.enabled (not $v.tls.existingSecret) -}}
{{- $p = append $p "tls.existingSecret: required when tls.enabled (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- if and $v.tls.clientAuth (not $v.tls.enabled) -}}
{{- $p = append $p "tls.clientAuth: requires tls.enabled" -}}
{{- end -}}
{{- if and $v.tls.clientAuth $v.workers.groups -}}
{{- $p = append $p "tls.clientAuth: shardq-worker cannot present a client certificate; mTLS cannot be combined with worker groups" -}}
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
    {{- range $addr := splitList "\n" (include "shardq.shard.addresses" . | trim) }}
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
