-- Move due jobs from the tenants' delayed ZSETs to their ready lists (of their queue and
-- priority), at most `limit` per call (the caller calls again while `taken == limit`), in
-- (run-at, tenant, job ID) order: the tenant first on `due` gives its jobs due before the next
-- tenant's score (a merge of the tenants' ZSETs), then the next. O((log T + log N) per tenant
-- visited + limit) however many jobs wait. Paused tenants and queues are promoted too.
-- A tenant whose score on `due` is before its earliest job (a cancel or a move took that job)
-- gives nothing and gets its right score, or leaves `due` when it has no job scheduled.
-- Jobs still on the shard-wide delayed ZSET of the layout before `due` (a shard written by an
-- earlier version) are put on `due` first, `limit` at a call: nothing is left behind by an
-- upgrade, and on a shard without that ZSET it costs one read of an absent key.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, due, tscheduled, ready, tprio,
--                                              tqueues, qring, inring, counts, wake keys, and
--                                              the earlier layout's scheduled
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  limit                     (int)     most jobs to move in this call
-- ARGV[3]  ahead_ms                  (int)     move jobs due up to this long after now too
--                                              (absent: 0). A worker that claims one waits
--                                              until its run-at (by the claim's clock,
--                                              'ra' - 'sa') before its handler starts, so
--                                              the claim's own time is spent before run-at
-- A promoted job's hash gets 's' = 'ready'; its queue is hash field 'q' (absent: 'default').
-- Returns  {taken, next_due_ms, now_ms}: IDs taken off the delayed ZSETs, and entries moved
--          off the earlier layout's (call again while taken == limit); next_due_ms is -1 when
--          nothing is scheduled (else the first score on `due`: never after the earliest
--          run-at, so the loop wakes no later than it must); now_ms is the now compared with
--          run-at (the caller sleeps until next_due_ms by the shard's clock, not its own)
local now, limit = shard_now(ARGV[1]), tonumber(ARGV[2])
local ahead = math.max(0, tonumber(ARGV[3] or '0') or 0)
local cutoff = now + ahead

local old = redis.call('ZRANGE', k_old_scheduled(), 0, limit - 1, 'WITHSCORES')
for n = 1, #old, 2 do
  local tenant = redis.call('HGET', k_job(old[n]), 't')
  if tenant then due_by(tenant, tonumber(old[n + 1])) end
  redis.call('ZREM', k_old_scheduled(), old[n])
end

-- Entries moved off the earlier layout count as taken, so the caller calls again until none
-- is left (they go in run-at order: those left are never due before the ones on `due`).
local taken = #old / 2
while taken < limit do
  local heads = redis.call('ZRANGE', k_due(), '-inf', cutoff, 'BYSCORE', 'LIMIT', 0, 2,
    'WITHSCORES')
  local tenant = heads[1]
  if not tenant then break end
  -- Before the next tenant's score (a lower bound of its jobs), or up to it on a tie (`due`
  -- orders equal scores by tenant): jobs go in (run-at, tenant, job ID) order across tenants,
  -- through as many calls as a backlog takes.
  local upto = cutoff
  if heads[4] and tonumber(heads[4]) <= cutoff then
    upto = heads[4]
    if tonumber(heads[2]) < tonumber(heads[4]) then upto = '(' .. heads[4] end
  end
  local tkey = k_tscheduled(tenant)
  local ids = redis.call('ZRANGE', tkey, '-inf', upto, 'BYSCORE', 'LIMIT', 0, limit - taken)
  local promoted = 0
  for _, id in ipairs(ids) do
    local j = redis.call('HMGET', k_job(id), 'pr', 's', 'q')
    if j[2] == 'scheduled' then
      redis.call('HSET', k_job(id), 's', 'ready')
      push_ready(id, tenant, j[3] or DEFAULT_QUEUE, j[1])
      promoted = promoted + 1
    end
  end
  if #ids > 0 then chunked('ZREM', tkey, ids) end
  if promoted > 0 then
    redis.call('HINCRBY', k_counts(tenant), 'scheduled', -promoted)
    redis.call('HINCRBY', k_counts(tenant), 'ready', promoted)
  end
  taken = taken + #ids
  local first = redis.call('ZRANGE', tkey, 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('ZADD', k_due(), first[2], tenant)
  else
    redis.call('ZREM', k_due(), tenant)
  end
end
settle()
local first = redis.call('ZRANGE', k_due(), 0, 0, 'WITHSCORES')
local next_due = -1
if first[2] then next_due = tonumber(first[2]) end
return {taken, next_due, now}
