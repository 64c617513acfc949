-- Create or replace one tenant's recurring schedule and set its next tick.
-- KEYS[1]  {prefix}:                    (prefix)
-- KEYS[2]  {prefix}:schedules:{tenant}  (HASH)  schedule_id -> JSON spec
-- KEYS[3]  {prefix}:cron                (ZSET)  '{tenant}/{schedule_id}' scored by next tick ms
-- ARGV[1]  tenant, ARGV[2] schedule_id, ARGV[3] spec (JSON), ARGV[4] next_tick_ms (int)
-- ARGV[5]  max_schedules               (int)   most schedules per tenant (0 = no limit)
-- Returns  OK | OVER_QUOTA (the tenant has max_schedules already and this one is new)
-- A tick earlier than every other wakes the shard loop (KEYS[1] derives promoter_wake).
local tenant, sid, spec, tick, cap = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if cap > 0 and redis.call('HEXISTS', KEYS[2], sid) == 0 and redis.call('HLEN', KEYS[2]) >= cap then
  return OVER_QUOTA
end
redis.call('HSET', KEYS[2], sid, spec)
wake_promoter_if_first(KEYS[3], tonumber(tick))
redis.call('ZADD', KEYS[3], tick, tenant .. '/' .. sid)
return OK
