-- Take up to `limit` of a moving tenant's queued jobs off this (source) shard: scheduled jobs,
-- then ready jobs (most urgent first), then dead jobs. They leave every queue and gauge here
-- and their IDs go to the tenant's `moving` set; their hashes stay until the target has them
-- (move_drop). Nothing here runs them any more, and a mover that dies leaves them findable.
-- Active jobs are not touched: they finish, and are acked, here.
-- KEYS[1]  {prefix}:                 (prefix)  derives tscheduled, scheduled, ready, ring,
--                                              credit, dead, counts, job, moving keys
-- ARGV[1]  tenant
-- ARGV[2]  limit                     (int)     most jobs to take
-- Returns  the number of jobs taken
local tenant, limit = ARGV[1], tonumber(ARGV[2])
local taken = 0

local function take(id, state)
  redis.call('SADD', k_moving(tenant), id)
  redis.call('HINCRBY', k_counts(tenant), state, -1)
  taken = taken + 1
end

for _, id in ipairs(redis.call('ZRANGE', k_tscheduled(tenant), 0, limit - 1)) do
  redis.call('ZREM', k_scheduled(), id)
  redis.call('ZREM', k_tscheduled(tenant), id)
  take(id, 'scheduled')
end

for prio = 9, 0, -1 do
  if taken >= limit then break end
  local rkey = k_ready(tenant, prio)
  local ids = redis.call('LRANGE', rkey, 0, limit - taken - 1)
  if #ids > 0 then
    redis.call('LTRIM', rkey, #ids, -1)
    for _, id in ipairs(ids) do
      -- A job cancelled while ready is only skipped by claim; here it is simply dropped.
      if redis.call('HGET', k_job(id), 's') == 'ready' then take(id, 'ready') end
    end
    if redis.call('LLEN', rkey) == 0 then
      redis.call('LREM', k_ring(prio), 0, tenant)
      redis.call('HDEL', k_credit(prio), tenant)
    end
  end
end

if taken < limit then
  for _, id in ipairs(redis.call('ZRANGE', k_dead(tenant), 0, limit - taken - 1)) do
    redis.call('ZREM', k_dead(tenant), id)
    take(id, 'dead')
  end
end
return taken
