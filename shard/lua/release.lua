-- Hand active jobs back to ready at once, without waiting for their leases to expire: a worker
-- shutting down, or one that has no handler of the job's name (avoid_ms > 0: that worker may
-- not claim the job again for avoid_ms, and the tenant's 'unrunnable' counter grows). The
-- attempt is not counted: the handler was stopped or never ran, it did not fail.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, leases, tactive, ready, tprio,
--                                              tqueues, qring, inring, counts, limits, parked,
--                                              paused, tqpaused, wake, outbox keys
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  retention_ms              (int)     how long a job cancelled meanwhile is kept
-- ARGV[3]  avoid_ms                  (int, ms) 0: any worker may claim it again; > 0: not the
--                                              one that held it (its 'w') before now + avoid_ms
-- ARGV[4]  dedupe_ttl_ms             (int)     the window of a tenant whose limits:{t} has no
--                                              'dedupe', for the dedupe key written at a job's
--                                              end (_lib.lua, dedupe_after_end)
-- ARGV[5..] pairs: job_id, fence    (string, int) fence must equal job hash field 'f'
-- A released job gets 's' = 'ready' (in its queue 'q') and 'at' - 1, and with avoid_ms > 0
-- 'xw' = its 'w' and 'xu' = now_ms + avoid_ms (claim.lua honours them); a job whose cancel
-- was requested ('cx' = 1) ends 's' = 'cancelled' with 'fa' = now_ms and its payload leaves
-- counts:{t} 'bytes'. A tenant parked at its max_active is un-parked once below it.
-- Returns  one code per pair: OK | CANCELLED (cancel was requested: it ends cancelled)
--          | STALE_LEASE (not ours any more: nothing changed)
local now, retention, avoid_ms = shard_now(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local dedupe_ttl = tonumber(ARGV[4])
local out = {}
for i = 5, #ARGV, 2 do
  local id, fence = ARGV[i], ARGV[i + 1]
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 'f', 'cx', 't', 'pr', 'q', 'w')
  if j[1] ~= 'active' or j[2] ~= fence then
    out[#out + 1] = STALE_LEASE
  else
    local tenant = j[4]
    end_lease(id, tenant)
    if j[3] == '1' then
      redis.call('HSET', job, 's', 'cancelled', 'fa', now)
      redis.call('PEXPIRE', job, retention)
      job_ended(id, job, tenant, now, dedupe_ttl)
      to_outbox(id, now) -- a released job gets no row from its worker: the shard loop writes it
      out[#out + 1] = CANCELLED
    else
      redis.call('HSET', job, 's', 'ready')
      redis.call('HINCRBY', job, 'at', -1)
      if avoid_ms > 0 then
        redis.call('HSET', job, 'xw', j[7], 'xu', now + avoid_ms)
        redis.call('HINCRBY', k_counts(tenant), 'unrunnable', 1)
      end
      push_ready(id, tenant, j[6] or DEFAULT_QUEUE, j[5])
      redis.call('HINCRBY', k_counts(tenant), 'ready', 1)
      out[#out + 1] = OK
    end
  end
end
settle()
return out
