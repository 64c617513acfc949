-- After the shard loop committed (or read) the result rows of finished jobs: take each job off
-- the outbox, unless it was put back meanwhile (a requeued job that ended again, whose new
-- end still needs its row), and where the row records a different end than Redis, make Redis
-- say what the row says (the row decides: it was committed with whatever the handler wrote).
-- Only 'succeeded' and 'cancelled' rows are taken over, and only by a job that is 'dead' or
-- 'cancelled' in Redis: a 'dead' row is the one a later run may still replace, and a job that
-- was requeued since (scheduled, ready, active) has not ended.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, dead, counts, outbox keys
-- ARGV[1]  retention_ms              (int)     how long a job hash that now ended succeeded or
--                                              cancelled is kept
-- ARGV[2..] 3 entries per job
--   job_id                           (string)  the hash's key {prefix}:job:{job_id}
--   outbox_score                     (int|'')  its score on the outbox when read (unix ms); ''
--                                              leaves the outbox alone (the reconciler)
--   row_status                       (string)  the row's status after the write
-- A dead job that takes 'succeeded' or 'cancelled' leaves dead:{t} (counts:{t} 'dead' - 1;
-- 'succeeded' + 1 when it succeeded) and gets the retention TTL; 's' is set to the row's.
-- Returns  one flag per job: 1 when Redis took the row's status, else 0
local retention = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 3 do
  local id, score, row = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if score ~= '' then
    local now_score = redis.call('ZSCORE', k_outbox(), id)
    if now_score and tonumber(now_score) == tonumber(score) then
      redis.call('ZREM', k_outbox(), id)
    end
  end
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 't')
  local state, tenant = j[1], j[2]
  if (row == 'succeeded' or row == 'cancelled') and state ~= row
      and (state == 'dead' or state == 'cancelled') then
    if state == 'dead' then
      redis.call('ZREM', k_dead(tenant), id)
      redis.call('HINCRBY', k_counts(tenant), 'dead', -1)
    end
    if row == 'succeeded' then redis.call('HINCRBY', k_counts(tenant), 'succeeded', 1) end
    redis.call('HSET', job, 's', row)
    redis.call('PEXPIRE', job, retention)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
