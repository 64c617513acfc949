-- End a tenant's presence on this (source) shard once it holds nothing of it: no scheduled,
-- ready, active or dead job, nothing set aside, and no submit since the mover last looked
-- (its `submitted` counter is unchanged). Its counters are set aside in movedcounts for the
-- target to add; the tenant leaves the shard's tenant set, its limits, rate bucket and pause
-- state go (the mover gave them to the target when the move began).
-- KEYS[1]  {prefix}:                 (prefix)  derives tscheduled, tactive, dead, tqueues,
--                                              ready (previous layout), moving, schedules,
--                                              movingsched, counts, movedcounts, tenants,
--                                              limits, bucket, paused, parked, tqpaused keys
-- ARGV[1]  tenant
-- ARGV[2]  submitted counter the mover saw before its last pass
-- Returns  {1, ''} when done | {0, what is still here}
local tenant, seen = ARGV[1], ARGV[2]
local checks = {
  {'ZCARD', k_tscheduled(tenant), 'scheduled jobs'},
  {'ZCARD', k_tactive(tenant), 'active jobs'},
  {'ZCARD', k_dead(tenant), 'dead jobs'},
  {'SCARD', k_tqueues(tenant), 'ready jobs'},
  {'SCARD', k_moving(tenant), 'jobs being copied'},
  {'HLEN', k_schedules(tenant), 'schedules'},
  {'HLEN', k_moving_schedules(tenant), 'schedules being copied'},
}
for _, c in ipairs(checks) do
  if redis.call(c[1], c[2]) > 0 then return {0, c[3]} end
end
for prio = 0, 9 do
  if redis.call('LLEN', k_old_ready(tenant, prio)) > 0 then
    return {0, 'ready jobs of the previous layout (being upgraded)'}
  end
end
if (redis.call('HGET', k_counts(tenant), 'submitted') or '0') ~= seen then
  return {0, 'new submits'}
end
if redis.call('EXISTS', k_counts(tenant)) == 1 then
  if redis.call('EXISTS', k_moved_counts(tenant)) == 1 then
    return {0, 'counters not yet added to the target'}
  end
  redis.call('RENAME', k_counts(tenant), k_moved_counts(tenant))
end
redis.call('SREM', k_tenants(), tenant)
redis.call('DEL', k_limits(tenant), k_bucket(tenant))
redis.call('SREM', k_paused(), tenant)
redis.call('SREM', k_parked(), tenant)
-- The tenant's paused queues: a SCAN of the (small, operator-written) set, in steps.
local cursor = '0'
repeat
  local page = redis.call('SSCAN', k_tqpaused(), cursor, 'MATCH', tenant .. '/*', 'COUNT', 1000)
  cursor = page[1]
  for _, member in ipairs(page[2]) do redis.call('SREM', k_tqpaused(), member) end
until cursor == '0'
return {1, ''}
