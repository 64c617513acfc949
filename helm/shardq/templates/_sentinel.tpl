{{/*
A shard's Redis under Sentinel (shards.sentinel.enabled): the primary's container in the shard
StatefulSet and each replica's, all but the name. It starts through start-redis.sh, as the
replica of the primary the sentinels name now, or of the one it finds among the shard's Redis,
or, with the whole shard down, of the one the shard's Redis elect (pod i of the shard
StatefulSet on a first start). It fences itself: with no replica acknowledging for
minReplicasMaxLagS it refuses writes, so a primary cut off from the others cannot take writes
the promoted replica will not have.
Call with (dict "ctx" $ "i" <shard index, or "" to read it from the pod> "service" <headless
Service>).
*/}}
{{- define "shardq.sentinel.redisContainer" -}}
{{- $ := .ctx -}}
{{- $r := $.Values.shards.redis -}}
{{- $sn := $.Values.shards.sentinel -}}
{{- $domain := printf "%s.svc.%s" $.Release.Namespace $.Values.clusterDomain -}}
image: "{{ $r.image.repository }}:{{ $r.image.tag }}"
imagePullPolicy: {{ $r.image.pullPolicy }}
command: ["sh", "/scripts/start-redis.sh"]
args:
  - --port
  - {{ $r.port | quote }}
  - --dir
  - /data
  - --appendonly
  - "yes"
  - --appendfsync
  - {{ $r.appendfsync | quote }}
  - --maxmemory-policy
  - noeviction
  {{- if $r.maxmemory }}
  - --maxmemory
  - {{ $r.maxmemory | quote }}
  {{- end }}
  - --replica-announce-ip
  - $(POD_FQDN)
  - --min-replicas-to-write
  - "1"
  - --min-replicas-max-lag
  - {{ $sn.minReplicasMaxLagS | quote }}
  {{- range $r.extraArgs }}
  - {{ . | quote }}
  {{- end }}
env:
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: POD_FQDN
    value: "$(POD_NAME).{{ .service }}.{{ $domain }}"
  - name: SHARD_INDEX
    {{- if eq (toString .i) "" }}
    valueFrom:
      fieldRef:
        fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
    {{- else }}
    value: {{ .i | quote }}
    {{- end }}
  - name: SHARD_MASTER
    value: "{{ include "shardq.shard.fullname" $ }}-$(SHARD_INDEX)"
  - name: SENTINELS
    value: {{ include "shardq.sentinel.group" $ | quote }}
  - name: KEY_PREFIX
    value: {{ $.Values.keyPrefix | quote }}
  - name: WHOLE_SHARD_WAIT_S
    value: {{ $sn.wholeShardWaitSeconds | quote }}
  - name: SHARD_REDIS_HOSTS
    value: {{ include "shardq.sentinel.redisHosts" $ | quote }}
  - name: REDIS_PORT
    value: {{ $r.port | quote }}
  - name: REDIS_PASSWORD
    valueFrom:
      secretKeyRef:
        name: {{ include "shardq.redis.secretName" $ }}
        key: {{ $r.auth.existingSecretKey }}
  # redis-cli (the probe, start-redis.sh asking the sentinels) authenticates from this variable.
  - name: REDISCLI_AUTH
    valueFrom:
      secretKeyRef:
        name: {{ include "shardq.redis.secretName" $ }}
        key: {{ $r.auth.existingSecretKey }}
ports:
  - name: redis
    containerPort: {{ $r.port }}
    protocol: TCP
startupProbe:
  tcpSocket:
    port: redis
  {{- toYaml $r.startupProbe | nindent 2 }}
readinessProbe:
  exec:
    command: ["sh", "-c", "redis-cli -h 127.0.0.1 -p {{ $r.port }} ping | grep -q PONG"]
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
livenessProbe:
  tcpSocket:
    port: redis
  initialDelaySeconds: 10
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 6
resources:
  {{- toYaml $r.resources | nindent 2 }}
securityContext:
  {{- toYaml $r.containerSecurityContext | nindent 2 }}
volumeMounts:
  - name: data
    mountPath: /data
  - name: tmp
    mountPath: /tmp
  - name: scripts
    mountPath: /scripts
  {{- if $r.aclUsers.enabled }}
  - name: redis-users
    mountPath: /redis-users
  {{- end }}
{{- end -}}

{{/*
Shell lines that write the Redis password ($REDIS_PASSWORD, from the Secret) into a config file
that redis-server reads first ($REDIS_AUTH_CONF, under $TMPDIR or /tmp: the pod's own emptyDir),
so that no command line carries it (`ps`, /proc/<pid>/cmdline: anyone on the node could read
it there). Only shell builtins see the password as an argument (printf); sed, which escapes
the quotes and backslashes a Redis config string must escape, reads it on its standard input.
The file is the process's own (umask 077). masterauth too: any shard Redis may become a replica.
*/}}
{{- define "shardq.redis.authConf" -}}
umask 077
REDIS_AUTH_CONF="${TMPDIR:-/tmp}/redis-auth.conf"
pw=$(printf '%s' "$REDIS_PASSWORD" | sed 's/[\\"]/\\&/g')
printf 'requirepass "%s"\nmasterauth "%s"\n' "$pw" "$pw" > "$REDIS_AUTH_CONF"
unset pw
{{- if .Values.shards.redis.aclUsers.enabled }}
# The role users (shardq.redisUsers.initContainer wrote them); default keeps the password.
printf 'include /redis-users/users.conf\n' >> "$REDIS_AUTH_CONF"
{{- end }}
{{- end -}}

{{/* The pods of a shard's Sentinel groups, which reach each other's Redis and sentinel ports. */}}
{{- define "shardq.sentinel.peers" -}}
{{- range $c := list "shard" "shard-replica" "sentinel" }}
- podSelector:
    matchLabels:
      {{- include "shardq.selectorLabels" (dict "ctx" $ "component" $c) | nindent 6 }}
{{- end }}
{{- end -}}

{{/* shard i's address in the shard map for its loop: its Sentinel group (SHARDQ_SHARD_ID is set before). */}}
{{- define "shardq.sentinel.loopUrl" -}}
sentinel://{{ include "shardq.sentinel.group" . }}/{{ include "shardq.shard.fullname" . }}-$(SHARDQ_SHARD_ID)
{{- end -}}


{{/* discover N: shard N's primary among its Redis (SHARD_REDIS_HOSTS, below), as host:port
(empty when none answers as one): the one with the most replicas attached, then the furthest
replication offset. Shared by start-sentinel.sh and start-redis.sh. */}}
{{- define "shardq.sentinel.discoverFn" -}}
discover() {
  best="" most=-1 furthest=-1
  for h in $(echo "$SHARD_REDIS_HOSTS" | cut -d ';' -f "$(($1 + 1))" | tr ',' ' '); do
    info=$(redis-cli -h "${h%:*}" -p "${h##*:}" --no-auth-warning INFO replication \
      2>/dev/null | tr -d '\r') || continue
    case "$info" in *role:master*) ;; *) continue ;; esac
    n=$(echo "$info" | sed -n 's/^connected_slaves://p')
    off=$(echo "$info" | sed -n 's/^master_repl_offset://p')
    n=${n:-0} off=${off:-0}
    if [ "$n" -gt "$most" ] || { [ "$n" -eq "$most" ] && [ "$off" -gt "$furthest" ]; }; then
      best="$h" most="$n" furthest="$off"
    fi
  done
  echo "$best"
}
{{- end -}}

{{/* Every shard's Redis as host:port, pod i of the shard StatefulSet first, then its replicas:
','-separated, shards ';'-separated (start-sentinel.sh's SHARD_REDIS_HOSTS). */}}
{{- define "shardq.sentinel.redisHosts" -}}
{{- $s := .Values.shards -}}
{{- $shard := include "shardq.shard.fullname" . -}}
{{- $domain := printf "%s.svc.%s" .Release.Namespace .Values.clusterDomain -}}
{{- $port := int $s.redis.port -}}
{{- $groups := list -}}
{{- range $i := until (int $s.count) -}}
{{- $hosts := list (printf "%s-%d.%s.%s:%d" $shard $i $shard $domain $port) -}}
{{- range $j := until (int $s.sentinel.replicas) -}}
{{- $hosts = append $hosts (printf "%s-%d-replica-%d.%s-replica.%s:%d" $shard $i $j $shard $domain $port) -}}
{{- end -}}
{{- $groups = append $groups (join "," $hosts) -}}
{{- end -}}
{{- join ";" $groups -}}
{{- end -}}
