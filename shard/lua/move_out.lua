-- Take up to `limit` of a moving tenant's queued jobs off this (source) shard: scheduled jobs,
-- then ready jobs (queue by queue, most urgent first), then dead jobs. They leave every queue,
-- ring and gauge here (their payloads leave 'bytes') and their IDs go to the tenant's `moving`
-- set; their hashes stay until the target has them (move_drop). Nothing here runs them any
-- more, and a mover that dies leaves them findable. Active jobs are not touched: they finish,
-- and are acked, here.
-- KEYS[1]  {prefix}:                 (prefix)  derives tscheduled, due, tqueues, tprio,
--                                              ready, qring, inring, qcredit, dead, counts,
--                                              job, moving keys
-- ARGV[1]  tenant
-- ARGV[2]  limit                     (int)     most jobs to take
-- Returns  the number of jobs taken
local tenant, limit = ARGV[1], tonumber(ARGV[2])
local taken = {}
-- Counts and the moving set changed once at the end, queues' members removed many at a call:
-- each call costs microseconds, and per-job calls made a batch of 100 block the shard ~7 ms.
local counted = {scheduled = 0, ready = 0, dead = 0}

local function take(id, state)
  taken[#taken + 1] = id
  counted[state] = counted[state] + 1
  if state ~= 'dead' then uncount_bytes(k_job(id), tenant) end
end

local ids = redis.call('ZRANGE', k_tscheduled(tenant), 0, limit - 1)
if #ids > 0 then
  chunked('ZREM', k_tscheduled(tenant), ids)
  undue_if_empty(tenant)
  for _, id in ipairs(ids) do take(id, 'scheduled') end
end

for _, q in ipairs(redis.call('SMEMBERS', k_tqueues(tenant))) do
  if #taken >= limit then break end
  local tprio = k_tprio(tenant, q)
  for _, prio in ipairs(redis.call('ZREVRANGE', tprio, 0, -1)) do
    if #taken >= limit then break end
    local rkey = k_ready(tenant, q, prio)
    local ready = redis.call('LRANGE', rkey, 0, limit - #taken - 1)
    redis.call('LTRIM', rkey, #ready, -1)
    for _, id in ipairs(ready) do
      -- A job cancelled while ready is only skipped by claim; here it is simply dropped.
      if redis.call('HGET', k_job(id), 's') == 'ready' then take(id, 'ready') end
    end
    if redis.call('LLEN', rkey) == 0 then redis.call('ZREM', tprio, prio) end
  end
  if redis.call('ZCARD', tprio) == 0 then
    redis.call('SREM', k_tqueues(tenant), q)
    if redis.call('SREM', k_inring(q), tenant) == 1 then
      redis.call('LREM', k_ring(q), 0, tenant)
    end
    redis.call('HDEL', k_credit(q), tenant)
  end
end

if #taken < limit then
  local dead = redis.call('ZRANGE', k_dead(tenant), 0, limit - #taken - 1)
  if #dead > 0 then
    chunked('ZREM', k_dead(tenant), dead)
    for _, id in ipairs(dead) do take(id, 'dead') end
  end
end
chunked('SADD', k_moving(tenant), taken)
for state, n in pairs(counted) do
  if n > 0 then redis.call('HINCRBY', k_counts(tenant), state, -n) end
end
settle()
return #taken
