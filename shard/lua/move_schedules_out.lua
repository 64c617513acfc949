-- Take a moving tenant's recurring schedules off this (source) shard in one step, so the
-- shard loop here fires none of them any more; they wait in the tenant's movingsched HASH
-- until the target has them. Each keeps its next tick, and whether that tick was already
-- fired here (its job's dedupe key exists, or its job's hash at the ID derived from its
-- request ID: FOLDED_FORMAT), so the target neither skips nor repeats it.
-- KEYS[1]  {prefix}:                 (prefix)  derives schedules, cron, dedupe, job,
--                                              movingsched
-- ARGV[1]  tenant
-- Returns  the number of schedules set aside
local tenant = ARGV[1]
local specs = redis.call('HGETALL', k_schedules(tenant))
for j = 1, #specs, 2 do
  local sid, spec = specs[j], specs[j + 1]
  local member = tenant .. '/' .. sid
  local tick = redis.call('ZSCORE', k_cron(), member) or '0'
  local rid = 'cron:' .. sid .. ':' .. tick
  local found = redis.call('EXISTS', k_dedupe(tenant, rid), k_job(derived_id(tenant, rid)))
  local fired = math.min(1, found)
  redis.call('HSET', k_moving_schedules(tenant), sid, tick .. ' ' .. fired .. ' ' .. spec)
  redis.call('ZREM', k_cron(), member)
end
redis.call('DEL', k_schedules(tenant))
return #specs / 2
