-- Move a schedule from the tick it just fired to its next one, only if no other loop did it
-- first (compare-and-set on the score). The occurrence itself was enqueued before this with
-- request_id 'cron:{schedule_id}:{tick}', so a crash in between re-enqueues a deduplicated job.
-- KEYS[1]  {prefix}:                    (prefix)
-- KEYS[2]  {prefix}:cron                (ZSET)  '{tenant}/{schedule_id}' scored by next tick ms
-- ARGV[1]  member ('{tenant}/{schedule_id}'), ARGV[2] fired_tick_ms, ARGV[3] next_tick_ms
-- Returns  OK | NOT_FOUND (deleted meanwhile) | CONFLICT (another loop advanced it)
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then return NOT_FOUND end
if tonumber(score) ~= tonumber(ARGV[2]) then return CONFLICT end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return OK
