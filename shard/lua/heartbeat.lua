-- Extend the leases of jobs a worker still holds, in one call. A stale fencing token (the
-- lease was reaped, the job re-claimed or finished) is refused and changes nothing.
-- KEYS[1]  {prefix}:                 (prefix)  derives job keys
-- KEYS[2]  {prefix}:leases           (ZSET)    job_id scored by lease deadline (unix ms)
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  lease_ms                  (int)     new lease length from now
-- ARGV[3..] pairs: job_id, fence    (string, int) fence must equal job hash field 'f'
-- Returns  one code per pair: OK | CANCEL_REQUESTED (lease extended; the job was cancelled,
--          stop it) | STALE_LEASE (the lease is lost: stop the handler, record nothing)
local deadline = shard_now(ARGV[1]) + tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local id, fence = ARGV[i], ARGV[i + 1]
  local j = redis.call('HMGET', k_job(id), 's', 'f', 'cx')
  if j[1] ~= 'active' or j[2] ~= fence then
    out[#out + 1] = STALE_LEASE
  else
    redis.call('ZADD', KEYS[2], 'XX', deadline, id)
    out[#out + 1] = j[3] == '1' and CANCEL_REQUESTED or OK
  end
end
return out
