-- Move due jobs from the delayed ZSET to their tenants' ready lists (of their queue and
-- priority), at most `limit` per call (the caller calls again while `promoted == limit`).
-- O(log N + limit) however many jobs wait. Paused tenants and queues are promoted too.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, ready, tprio, tqueues, qring, inring,
--                                              tscheduled, counts, wake keys
-- KEYS[2]  {prefix}:scheduled        (ZSET)    job_id scored by run_at_ms
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  limit                     (int)     most jobs to move in this call
-- ARGV[3]  ahead_ms                  (int)     move jobs due up to this long after now too
--                                              (absent: 0). A worker that claims one waits
--                                              until its run-at (by the claim's clock,
--                                              'ra' - 'sa') before its handler starts, so
--                                              the claim's own time is spent before run-at
-- A promoted job's hash gets 's' = 'ready'; its queue is hash field 'q' (absent: 'default').
-- Returns  {taken, next_due_ms, now_ms}: IDs taken off the ZSET (call again while taken ==
--          limit); next_due_ms is -1 when nothing is scheduled; now_ms is the now compared with
--          run-at (the caller sleeps until next_due_ms by the shard's clock, not its own)
local now, limit = shard_now(ARGV[1]), tonumber(ARGV[2])
local ahead = math.max(0, tonumber(ARGV[3] or '0') or 0)
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now + ahead, 'LIMIT', 0, limit)
local promoted = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  local j = redis.call('HMGET', k_job(id), 't', 'pr', 's', 'q')
  if j[3] == 'scheduled' then
    redis.call('ZREM', k_tscheduled(j[1]), id)
    redis.call('HSET', k_job(id), 's', 'ready')
    push_ready(id, j[1], j[4] or DEFAULT_QUEUE, j[2])
    redis.call('HINCRBY', k_counts(j[1]), 'scheduled', -1)
    redis.call('HINCRBY', k_counts(j[1]), 'ready', 1)
    promoted = promoted + 1
  end
end
settle()
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local next_due = -1
if first[2] then next_due = tonumber(first[2]) end
return {#ids, next_due, now}
