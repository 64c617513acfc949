-- Hand active jobs back to ready at once (a worker shutting down), without waiting for their
-- leases to expire. The attempt is not counted: the handler was stopped, it did not fail.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, leases, tactive, ready, ring,
--                                              counts, wake keys
-- ARGV[1..] pairs: job_id, fence    (string, int) fence must equal job hash field 'f'
-- A released job gets 's' = 'ready' and 'at' - 1 (or 's' = 'cancelled' when its 'cx' is 1).
-- Returns  one code per pair: OK | CANCELLED (cancel was requested: it ends cancelled)
--          | STALE_LEASE (not ours any more: nothing changed)
local out = {}
local released = 0
for i = 1, #ARGV, 2 do
  local id, fence = ARGV[i], ARGV[i + 1]
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 'f', 'cx', 't', 'pr')
  if j[1] ~= 'active' or j[2] ~= fence then
    out[#out + 1] = STALE_LEASE
  else
    local tenant = j[4]
    end_lease(id, tenant)
    if j[3] == '1' then
      redis.call('HSET', job, 's', 'cancelled')
      out[#out + 1] = CANCELLED
    else
      redis.call('HSET', job, 's', 'ready')
      redis.call('HINCRBY', job, 'at', -1)
      push_ready(id, tenant, j[5])
      redis.call('HINCRBY', k_counts(tenant), 'ready', 1)
      released = released + 1
      out[#out + 1] = OK
    end
  end
end
if released > 0 then wake_workers() end
return out
