-- Move dead jobs of one tenant back to ready with a fresh set of attempts.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, ready, tprio, tqueues, qring,
--                                              inring, counts, wake keys
-- KEYS[2]  {prefix}:dead:{tenant}    (ZSET)    the tenant's dead job IDs
-- ARGV[1]  tenant                    (string)
-- ARGV[2..] job IDs
-- A requeued job's hash gets 's' = 'ready' (in its queue 'q') and 'at' = 0, and loses 'fa'
-- and 'sr';
-- its payload counts in counts:{t} 'bytes' again.
-- Returns  {requeued, {job IDs that were not dead jobs of this tenant}}
local tenant = ARGV[1]
local requeued, missing = 0, {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 'pr', 'q')
  if j[1] and redis.call('ZREM', KEYS[2], id) == 1 then
    redis.call('HSET', job, 's', 'ready', 'at', 0)
    redis.call('HDEL', job, 'fa', 'sr')
    push_ready(id, tenant, j[3] or DEFAULT_QUEUE, j[2])
    redis.call('HINCRBY', k_counts(tenant), 'dead', -1)
    redis.call('HINCRBY', k_counts(tenant), 'ready', 1)
    add_bytes(tenant, redis.call('HSTRLEN', job, 'p'))
    requeued = requeued + 1
  else
    missing[#missing + 1] = id
  end
end
settle()
return {requeued, missing}
