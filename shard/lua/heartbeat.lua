-- Extend the leases of jobs a worker still holds, in one call, and store the progress their
-- handlers reported since the last call. A stale fencing token (the lease was reaped, the job
-- re-claimed or finished) is refused and changes nothing: neither the lease nor the progress.
-- KEYS[1]  {prefix}:                 (prefix)  derives job keys
-- KEYS[2]  {prefix}:leases           (ZSET)    job_id scored by lease deadline (unix ms)
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  lease_ms                  (int)     new lease length from now
-- ARGV[3..] triples: job_id, fence, progress
--   job_id                           (string)  the hash's key {prefix}:job:{job_id}
--   fence                            (int)     must equal job hash field 'f'
--   progress                         (string)  "<fraction> <message>" (JobProgress.to_arg) ->
--                                              'pg' = "<now_ms> <fraction> <message>"; ''
--                                              when the handler reported nothing new
-- Returns  one code per triple: OK | CANCEL_REQUESTED (lease extended; the job was cancelled,
--          stop it) | STALE_LEASE (the lease is lost: stop the handler, record nothing)
local now = shard_now(ARGV[1])
local deadline = int_s(now + tonumber(ARGV[2]))
local out = {}
for i = 3, #ARGV, 3 do
  local id, fence, progress = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 'f', 'cx')
  if j[1] ~= 'active' or j[2] ~= fence then
    out[#out + 1] = STALE_LEASE
  else
    redis.call('ZADD', KEYS[2], 'XX', deadline, id)
    if progress ~= '' then redis.call('HSET', job, 'pg', now .. ' ' .. progress) end
    out[#out + 1] = j[3] == '1' and CANCEL_REQUESTED or OK
  end
end
return out
