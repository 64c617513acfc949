-- Record failed attempts: back to the delayed ZSET for a retry after retry_in_ms, or to the
-- tenant's dead-letter set when attempts are used up or the failure is permanent. The retry
-- delay (exponential backoff with jitter) is chosen by the caller: no randomness here; the
-- retry's run-at is the shard's now plus that delay.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, leases, tactive, scheduled,
--                                              tscheduled, dead, counts, promoter_wake, limits,
--                                              parked, paused, tqpaused, tqueues, qring,
--                                              inring, wake, outbox keys
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  retention_ms              (int)     how long a job cancelled meanwhile is kept
-- ARGV[3..] 5 entries per job (a Failure); "-> 'x'" names the job hash field it is stored in
--   job_id                           (string)  the hash's key {prefix}:job:{job_id}
--   fence                            (int)     must equal 'f' (the lease's token)
--   error                            (string)  -> 'e'
--   retry_in_ms                      (int, ms) 'ra' = now + retry_in_ms when retried (and the
--                                              delayed ZSET score)
--   permanent                        (0 | 1)   1 = dead now, whatever attempts remain
-- A job that ends (dead, cancelled) also gets 'fa' = now_ms and its payload leaves
-- counts:{t} 'bytes'; 's' is set to the state returned. A tenant parked at its max_active is
-- un-parked once below it.
-- Returns  one {code, state} per job (FailResult), state being 's' after the call: OK with
--          'scheduled' or 'dead' | CANCELLED (cancel was requested while it ran)
--          | STALE_LEASE (nothing changed; the job's 's', '' when there is no job)
local now, retention = shard_now(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 5 do
  local id, fence, err = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local retry_at, permanent = now + tonumber(ARGV[i + 3]), ARGV[i + 4] == '1'
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 'f', 'cx', 't', 'at', 'ma')
  if j[1] ~= 'active' or j[2] ~= fence then
    out[#out + 1] = {STALE_LEASE, j[1] or ''}
  else
    local tenant = j[4]
    end_lease(id, tenant)
    redis.call('HINCRBY', k_counts(tenant), 'failed', 1)
    if j[3] == '1' then
      redis.call('HSET', job, 's', 'cancelled', 'fa', now, 'e', err)
      redis.call('PEXPIRE', job, retention)
      uncount_bytes(job, tenant)
      to_outbox(id, now) -- its worker writes no row for a failure: the shard loop does
      out[#out + 1] = {CANCELLED, 'cancelled'}
    elseif permanent or tonumber(j[5]) >= tonumber(j[6]) then
      redis.call('HSET', job, 's', 'dead', 'fa', now, 'e', err)
      push_dead(id, tenant, now)
      uncount_bytes(job, tenant)
      out[#out + 1] = {OK, 'dead'}
    else
      redis.call('HSET', job, 's', 'scheduled', 'ra', retry_at, 'e', err)
      push_scheduled(id, tenant, retry_at)
      redis.call('HINCRBY', k_counts(tenant), 'scheduled', 1)
      out[#out + 1] = {OK, 'scheduled'}
    end
  end
end
settle()
return out
