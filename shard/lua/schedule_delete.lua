-- Delete one tenant's recurring schedule. Jobs it already enqueued are left alone.
-- KEYS[1]  {prefix}:                    (prefix)
-- KEYS[2]  {prefix}:schedules:{tenant}  (HASH)  schedule_id -> JSON spec
-- KEYS[3]  {prefix}:cron                (ZSET)  '{tenant}/{schedule_id}' scored by next tick ms
-- ARGV[1]  tenant, ARGV[2] schedule_id
-- Returns  OK | NOT_FOUND (no such schedule; a stray cron entry is removed all the same)
local deleted = redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1] .. '/' .. ARGV[2])
if deleted == 0 then return NOT_FOUND end
return OK
