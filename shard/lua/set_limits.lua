-- Set a tenant's limits (all seven at once: a 0 removes the field, so the caller's default or
-- none applies), or adopt them on a move's target unless the tenant has limits here already.
-- A tenant parked at its max_active is un-parked (back on its rings, workers woken) when the
-- new cap is above its active jobs or gone; one at or over a new cap is parked. The tenant's
-- current turns start afresh (its credits go), so a turn always follows the weight now set.
-- KEYS[1]  {prefix}:                 (prefix)  derives limits, counts, parked, paused,
--                                              tqpaused, tqueues, qring, inring, qcredit,
--                                              wake keys
-- ARGV[1]  tenant                    (string)
-- ARGV[2]  mode                      (string)  'set' | 'adopt' (only if limits:{t} is absent)
-- ARGV[3]  weight                    (int)     -> limits:{t} 'weight' (jobs per turn, 1-1000)
-- ARGV[4]  max_active                (int)     -> 'max_active' (jobs active at once)
-- ARGV[5]  submit_rate_per_s         (float)   -> 'rate' (submits per s)
-- ARGV[6]  submit_burst              (int)     -> 'burst' (bucket size)
-- ARGV[7]  max_pending               (int)     -> 'max_pending' (jobs)
-- ARGV[8]  max_pending_bytes         (int)     -> 'max_pending_bytes' (payload bytes)
-- ARGV[9]  dedupe_window_s           (int)     -> 'dedupe' (s a request_id is deduplicated;
--                                              enqueue.lua's dedupe_ttl_ms where absent)
-- Returns  1 when written, 0 when 'adopt' found limits here already
local tenant, mode = ARGV[1], ARGV[2]
local key = k_limits(tenant)
if mode == 'adopt' and redis.call('EXISTS', key) == 1 then return 0 end
local names = {'weight', 'max_active', 'rate', 'burst', 'max_pending', 'max_pending_bytes',
  'dedupe'}
for n, name in ipairs(names) do
  local value = ARGV[n + 2]
  if tonumber(value) > 0 then
    redis.call('HSET', key, name, value)
  else
    redis.call('HDEL', key, name)
  end
end
for _, q in ipairs(redis.call('SMEMBERS', k_tqueues(tenant))) do
  redis.call('HDEL', k_credit(q), tenant)
end
local cap = tonumber(ARGV[4])
local active = tonumber(redis.call('HGET', k_counts(tenant), 'active') or '0') or 0
if cap > 0 and active >= cap then
  redis.call('SADD', k_parked(), tenant)
else
  unpark_if_below_cap(tenant, active)
end
settle()
return 1
