-- Enqueue a batch of jobs (any tenants of this shard): ready now, or scheduled for later.
-- Idempotent per (tenant, request_id) for the dedupe window; per-tenant quota and rate checked
-- atomically with the write, so a refused job writes nothing.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, ready, ring, tscheduled, dedupe,
--                                              counts, bucket, tenants, wake keys
-- ARGV[1]  now_ms                    (int)     caller's clock, unix ms
-- ARGV[2]  dedupe_ttl_ms             (int)     how long a request_id stays deduplicated
-- ARGV[3]  map_version               (int)     shard-map version the caller routed with; 0 for
--                                              the shard's own loop (cron), never refused
-- ARGV[4..] 12 entries per job (PreparedJob.to_argv in shard/records.py): entry j of job
--          k = 0, 1, ... is ARGV[3+k*12+j]; "-> 'x'" names the job hash field it is stored in
--   j=1   tenant           (string)          -> 't'
--   j=2   job_id           (string)          the hash's key {prefix}:job:{job_id}
--   j=3   request_id       (string)          -> 'r' (and the dedupe key's name)
--   j=4   handler          (string)          -> 'h'
--   j=5   payload          (bytes)           -> 'p'
--   j=6   priority         (int 0-9)         -> 'pr'
--   j=7   run_at_ms        (int, unix ms)    -> 'ra'
--   j=8   max_attempts     (int)             -> 'ma'
--   j=9   timeout_ms       (int, ms)         -> 'to'
--   j=10  digest           (string)          of handler+payload: kept in the dedupe key's value
--   j=11  max_pending      (int)             0 = no quota; not stored
--   j=12  rate_per_s       (float, per s)    0 = no limit; burst = max(1, rate_per_s); not stored
--          A job made here also gets 's' = 'ready' (or 'scheduled' when run_at_ms > now_ms),
--          'ca' = now_ms, 'at' = 0 and 'f' = 0.
-- Returns  one {code, job_id, state, retry_after_ms} per job, in order (EnqueueResult); job_id
--          is the hash's key, state its 's' ('' when there is no job):
--   OK | DEDUPLICATED (job_id of the first job, its state or '' if it expired)
--   | CONFLICT (same request_id, other handler/payload; job_id of the first)
--   | OVER_QUOTA | RATE_LIMITED (retry_after_ms > 0)
--   | STALE_MAP for every job when map_version is below the shard's map fence (a tenant is
--     moving off this shard): nothing written; retry_after_ms holds the version needed
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local map_version = tonumber(ARGV[3])
local STRIDE = 12
local FIRST = 4
local out = {}
local woke = false

if map_version > 0 then
  local needed = tonumber(redis.call('GET', k_map_fence()) or '0')
  if map_version < needed then
    for _ = FIRST, #ARGV, STRIDE do out[#out + 1] = {STALE_MAP, '', '', needed} end
    return out
  end
end

for i = FIRST, #ARGV, STRIDE do
  local tenant, id, rid, handler, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local prio, run_at = ARGV[i + 5], tonumber(ARGV[i + 6])
  local max_attempts, timeout_ms, digest = ARGV[i + 7], ARGV[i + 8], ARGV[i + 9]
  local max_pending, rate = tonumber(ARGV[i + 10]), tonumber(ARGV[i + 11])
  local dkey = k_dedupe(tenant, rid)
  local counts = k_counts(tenant)
  local seen = redis.call('GET', dkey)
  local result
  if seen then
    local first_id, first_digest = string.match(seen, '^(%S+) (%S+)$')
    local code = CONFLICT
    if first_digest == digest then code = DEDUPLICATED end
    result = {code, first_id, redis.call('HGET', k_job(first_id), 's') or '', 0}
  else
    if max_pending > 0 then
      local c = redis.call('HMGET', counts, 'scheduled', 'ready', 'active')
      local pending = (tonumber(c[1]) or 0) + (tonumber(c[2]) or 0) + (tonumber(c[3]) or 0)
      if pending >= max_pending then result = {OVER_QUOTA, '', '', 1000} end
    end
    if not result and rate > 0 then
      -- Token bucket refilled continuously at rate_per_s, holding at most max(1, rate) tokens.
      local burst = math.max(1, rate)
      local b = redis.call('HMGET', k_bucket(tenant), 'tokens', 'ts')
      local tokens, ts = tonumber(b[1]) or burst, tonumber(b[2]) or now
      tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
      if tokens < 1 then
        result = {RATE_LIMITED, '', '', math.ceil((1 - tokens) * 1000 / rate)}
      else
        tokens = tokens - 1
      end
      redis.call('HSET', k_bucket(tenant), 'tokens', tostring(tokens), 'ts', now)
      redis.call('PEXPIRE', k_bucket(tenant), math.ceil(burst * 1000 / rate) + 1000)
    end
    if not result then
      redis.call('SET', dkey, id .. ' ' .. digest, 'PX', ttl)
      local state = 'ready'
      if run_at > now then state = 'scheduled' end
      redis.call('HSET', k_job(id), 't', tenant, 'r', rid, 'h', handler, 'p', payload,
        'pr', prio, 's', state, 'ra', run_at, 'ca', now, 'at', 0, 'ma', max_attempts,
        'to', timeout_ms, 'f', 0)
      if state == 'ready' then
        push_ready(id, tenant, prio)
        woke = true
      else
        push_scheduled(id, tenant, run_at)
      end
      redis.call('HINCRBY', counts, state, 1)
      redis.call('HINCRBY', counts, 'submitted', 1)
      redis.call('SADD', k_tenants(), tenant)
      result = {OK, id, state, 0}
    end
  end
  out[#out + 1] = result
end
if woke then wake_workers() end
return out
