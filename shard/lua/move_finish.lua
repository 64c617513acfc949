-- End a tenant's presence on this (source) shard once it holds nothing of it: no scheduled,
-- ready, active or dead job, nothing set aside, and no submit since the mover last looked
-- (its `submitted` counter is unchanged). Its counters are set aside in movedcounts for the
-- target to add; the tenant leaves the shard's tenant set, weights and rate bucket.
-- KEYS[1]  {prefix}:                 (prefix)  derives tscheduled, tactive, dead, ready,
--                                              moving, schedules, movingsched, counts,
--                                              movedcounts, tenants, weights, bucket keys
-- ARGV[1]  tenant
-- ARGV[2]  submitted counter the mover saw before its last pass
-- Returns  {1, ''} when done | {0, what is still here}
local tenant, seen = ARGV[1], ARGV[2]
local checks = {
  {'ZCARD', k_tscheduled(tenant), 'scheduled jobs'},
  {'ZCARD', k_tactive(tenant), 'active jobs'},
  {'ZCARD', k_dead(tenant), 'dead jobs'},
  {'SCARD', k_moving(tenant), 'jobs being copied'},
  {'HLEN', k_schedules(tenant), 'schedules'},
  {'HLEN', k_moving_schedules(tenant), 'schedules being copied'},
}
for _, c in ipairs(checks) do
  if redis.call(c[1], c[2]) > 0 then return {0, c[3]} end
end
for prio = 0, 9 do
  if redis.call('LLEN', k_ready(tenant, prio)) > 0 then return {0, 'ready jobs'} end
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
redis.call('HDEL', k_weights(), tenant)
redis.call('DEL', k_bucket(tenant))
return {1, ''}
