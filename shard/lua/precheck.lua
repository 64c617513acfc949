-- The scheduled jobs that the shard loop may look up ahead of their run-at (shard/precheck.py):
-- those of (from, until] by run-at that were never claimed ('f' 0) and are not yet looked up
-- ('ck' absent). Read only; prechecked.lua marks the ones found without a final row. A cursor of
-- (from_ms, offset) walks a run of equal run-ats longer than one call's limit.
-- KEYS[1]  {prefix}:                 (prefix)  derives job keys
-- KEYS[2]  {prefix}:scheduled        (ZSET)    job_id scored by run_at_ms
-- ARGV[1]  from_ms                   (int)     lowest run-at read (inclusive), unix ms
-- ARGV[2]  offset                    (int)     entries of run-at from_ms to pass over first
-- ARGV[3]  until_ms                  (int)     highest run-at read (inclusive), unix ms
-- ARGV[4]  limit                     (int)     most ZSET entries read in this call
-- Returns  {read, last_run_at, last_run_at_count, id, tenant, request_id, ...}: read is the
--          number of ZSET entries read (fewer than limit: the range is done); last_run_at the
--          run-at of the last one read (-1 when none), last_run_at_count how many read had it;
--          then 3 entries per job to look up
local entries = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[3], 'WITHSCORES', 'LIMIT',
  tonumber(ARGV[2]), tonumber(ARGV[4]))
local out = {#entries / 2, -1, 0}
for i = 1, #entries, 2 do
  local id, at = entries[i], tonumber(entries[i + 1])
  if at == out[2] then out[3] = out[3] + 1 else out[2], out[3] = at, 1 end
  local j = redis.call('HMGET', k_job(id), 's', 'f', 'ck', 't', 'r')
  if j[1] == 'scheduled' and tonumber(j[2] or '0') == 0 and not j[3] then
    out[#out + 1], out[#out + 2], out[#out + 3] = id, j[4], j[5]
  end
end
return out
