-- Mark jobs done after their result rows are committed. A stale fencing token is refused and
-- changes nothing; a job cancelled while it ran ends as cancelled, not succeeded.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, leases, tactive, counts, limits,
--                                              parked, paused, tqpaused, tqueues, qring,
--                                              inring, wake, outbox keys
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  retention_ms              (int)     how long the finished job hash is kept
-- ARGV[3]  dedupe_ttl_ms             (int)     the window of a tenant whose limits:{t} has no
--                                              'dedupe', for the dedupe key written at a job's
--                                              end (_lib.lua, dedupe_after_end)
-- ARGV[4..] pairs: job_id, fence    (string, int) fence must equal job hash field 'f'
-- An acked job gets 's' = 'succeeded' (or 'cancelled' when its 'cx' is 1) and 'fa' = now_ms;
-- its payload leaves counts:{t} 'bytes'. A tenant parked at its max_active is un-parked (back
-- on its rings, their workers woken) once below it.
-- Returns  one code per pair: OK | CANCELLED (ended as cancelled) | STALE_LEASE
local now, retention, dedupe_ttl = shard_now(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local now_s = int_s(now)
local out = {}
for i = 4, #ARGV, 2 do
  local id, fence = ARGV[i], ARGV[i + 1]
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 'f', 'cx', 't', 'd', 'r', 'ca')
  if j[1] ~= 'active' or j[2] ~= fence then
    out[#out + 1] = STALE_LEASE
  else
    local tenant = j[4]
    end_lease(id, tenant)
    if j[3] == '1' then
      redis.call('HSET', job, 's', 'cancelled', 'fa', now_s)
      to_outbox(id, now) -- its worker may have committed a succeeded row: the loop settles it
      out[#out + 1] = CANCELLED
    else
      redis.call('HSET', job, 's', 'succeeded', 'fa', now_s)
      redis.call('HINCRBY', k_counts(tenant), 'succeeded', '1')
      out[#out + 1] = OK
    end
    redis.call('PEXPIRE', job, retention)
    job_ended(id, job, tenant, now, dedupe_ttl, {j[5], j[6], j[7]})
  end
end
settle()
return out
