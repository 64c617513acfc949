-- Resume what pause.lua paused (the same target): the tenant goes back on the ring of each
-- queue where it has ready jobs (and that is not paused for it alone, and unless it is still
-- parked or paused whole), and the workers of those queues are woken at once.
-- KEYS[1]  {prefix}:                 (prefix)  derives paused, qpaused, tqpaused, parked,
--                                              tqueues, qring, inring, wake keys
-- ARGV[1]  tenant                    (string)  '' for none
-- ARGV[2]  queue                     (string)  '' for none (at least one of the two is given)
-- Returns  1 when it was paused, 0 when it was not (nothing changed)
local tenant, q = ARGV[1], ARGV[2]
local resumed = 0
if q == '' then
  resumed = redis.call('SREM', k_paused(), tenant)
  if resumed == 1 then rering(tenant) end
elseif tenant == '' then
  resumed = redis.call('SREM', k_qpaused(), q)
  if resumed == 1 then to_wake[q] = true end
else
  resumed = redis.call('SREM', k_tqpaused(), tenant .. '/' .. q)
  if resumed == 1 and redis.call('SISMEMBER', k_tqueues(tenant), q) == 1
      and redis.call('SISMEMBER', k_paused(), tenant) == 0
      and redis.call('SISMEMBER', k_parked(), tenant) == 0 then
    ring_tenant(tenant, q)
    to_wake[q] = true
  end
end
settle()
return resumed
