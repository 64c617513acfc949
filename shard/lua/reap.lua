-- Take back jobs whose lease expired (the worker died or stalled): back to ready, or dead when
-- that was the last attempt. The expired attempt counts. Found by a range query on the lease
-- ZSET, never a key scan; at most `limit` per call (call again while reaped == limit).
-- KEYS[1]  {prefix}:                 (prefix)  derives job, tactive, ready, tprio, tqueues,
--                                              qring, inring, dead, counts, limits, parked,
--                                              paused, tqpaused, wake, outbox keys
-- KEYS[2]  {prefix}:leases           (ZSET)    job_id scored by lease deadline (unix ms)
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  limit                     (int)     most leases to take back in this call
-- ARGV[3]  retention_ms              (int)     how long a job cancelled meanwhile is kept
-- ARGV[4]  dedupe_ttl_ms             (int)     the window of a tenant whose limits:{t} has no
--                                              'dedupe', for the dedupe key written at a job's
--                                              end (_lib.lua, dedupe_after_end)
-- A reaped job's hash gets 'e' = 'lease expired' and 's' = 'ready' (in its queue 'q'), or
-- 'dead' / 'cancelled' with 'fa' = now_ms (its payload leaves counts:{t} 'bytes'). A tenant
-- parked at its max_active is un-parked once below it. A job ended dead or cancelled here has
-- no worker to write its result row: its ID goes on {prefix}:outbox (scored now_ms), where
-- the shard loop writes the row.
-- Returns  {taken, to_ready, to_dead}: taken counts the expired leases removed
local now, limit, retention = shard_now(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local dedupe_ttl = tonumber(ARGV[4])
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
local to_ready, to_dead = 0, 0
for _, id in ipairs(ids) do
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 't', 'pr', 'at', 'ma', 'cx', 'q')
  if j[1] ~= 'active' then
    redis.call('ZREM', KEYS[2], id)
  else
    local tenant = j[2]
    end_lease(id, tenant)
    redis.call('HINCRBY', k_counts(tenant), 'failed', 1)
    if j[6] == '1' then
      redis.call('HSET', job, 's', 'cancelled', 'fa', now, 'e', 'lease expired')
      redis.call('PEXPIRE', job, retention)
      job_ended(id, job, tenant, now, dedupe_ttl)
      to_outbox(id, now)
    elseif tonumber(j[4] or 0) >= tonumber(j[5] or UNSTORED_MAX_ATTEMPTS) then
      redis.call('HSET', job, 's', 'dead', 'fa', now, 'e', 'lease expired')
      push_dead(id, tenant, now)
      job_ended(id, job, tenant, now, dedupe_ttl)
      to_outbox(id, now)
      to_dead = to_dead + 1
    else
      redis.call('HSET', job, 's', 'ready', 'e', 'lease expired')
      push_ready(id, tenant, j[7] or DEFAULT_QUEUE, j[3])
      redis.call('HINCRBY', k_counts(tenant), 'ready', 1)
      to_ready = to_ready + 1
    end
  end
end
settle()
return {#ids, to_ready, to_dead}
