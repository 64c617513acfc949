-- Cancel one job of a tenant. Scheduled and ready jobs end at once (a ready job's ID is left in
-- its list and skipped by claim, which keeps this O(log N)); an active job is marked so that
-- its completion is recorded as cancelled, and its worker learns it at the next heartbeat.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, tscheduled, due, counts,
--                                              moving, outbox keys
-- ARGV[1]  tenant                    (string)  the caller's tenant: another's job is NOT_FOUND
-- ARGV[2]  job_id                    (string)
-- ARGV[3]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[4]  retention_ms              (int)     how long the cancelled job hash is kept
-- ARGV[5]  dedupe_ttl_ms             (int)     the window of a tenant whose limits:{t} has no
--                                              'dedupe', for the dedupe key written at a job's
--                                              end (_lib.lua, dedupe_after_end)
-- An active job gets 'cx' = 1; a job cancelled here gets 's' = 'cancelled' and 'fa' = now_ms,
-- and its payload leaves counts:{t} 'bytes', and its ID goes on {prefix}:outbox (scored
-- now_ms): no worker writes its result row, the shard loop does.
-- Returns  {code, state}, state being job hash field 's' ('' when there is no job):
--          OK ('cancelled') | CANCEL_REQUESTED ('active')
--          | ALREADY_TERMINAL (its final state) | NOT_FOUND
--          | MOVING (its tenant is moving and the job is being copied to the target: the
--            caller asks the target in a moment)
local tenant, id, now, retention = ARGV[1], ARGV[2], shard_now(ARGV[3]), tonumber(ARGV[4])
local dedupe_ttl = tonumber(ARGV[5])
local job = k_job(id)
local j = redis.call('HMGET', job, 't', 's')
if j[1] ~= tenant then return {NOT_FOUND, ''} end
if redis.call('SISMEMBER', k_moving(tenant), id) == 1 then return {MOVING, j[2]} end
local state = j[2]
if state == 'active' then
  redis.call('HSET', job, 'cx', 1)
  return {CANCEL_REQUESTED, 'active'}
elseif state == 'scheduled' then
  redis.call('ZREM', k_tscheduled(tenant), id)
  undue_if_empty(tenant)
elseif state ~= 'ready' then
  return {ALREADY_TERMINAL, state}
end
redis.call('HINCRBY', k_counts(tenant), state, -1)
job_ended(id, job, tenant, now, dedupe_ttl)
settle()
redis.call('HSET', job, 's', 'cancelled', 'fa', now)
redis.call('PEXPIRE', job, retention)
to_outbox(id, now)
return {OK, 'cancelled'}
