-- Mark jobs done after their result rows are committed. A stale fencing token is refused and
-- changes nothing; a job cancelled while it ran ends as cancelled, not succeeded.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, leases, tactive, counts, limits,
--                                              parked, paused, tqpaused, tqueues, qring,
--                                              inring, wake, outbox keys
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  retention_ms              (int)     how long the finished job hash is kept
-- ARGV[3]  dedupe_ttl_ms             (int)     the window of a tenant whose limits:{t} has no
--                                              'dedupe', for the dedupe key written at a job's
--                                              end (_lib.lua, dedupe_after_end)
-- ARGV[4..] pairs: job_id, fence    (string, int) fence must equal job hash field 'f'
-- An acked job gets 's' = 'succeeded' (or 'cancelled' when its 'cx' is 1) and 'fa' = now_ms;
-- its payload leaves counts:{t} 'bytes'. A tenant parked at its max_active is un-parked (back
-- on its rings, their workers woken) once below it.
-- Returns  one code per pair: OK | CANCELLED (ended as cancelled) | STALE_LEASE
local now, retention, dedupe_ttl = shard_now(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local now_s = int_s(now)
local out = {}
-- What end_lease (_lib.lua) and the 'succeeded' count do per job, done once per tenant at the
-- end: the jobs each tenant ended here, in the order met, and how many succeeded. Per job,
-- the two ZREMs and two HINCRBYs were a fifth of the server's instructions per acked job
-- (bench/script_instructions.py).
local ended, ended_tenants = {}, {}
for i = 4, #ARGV, 2 do
  local id, fence = ARGV[i], ARGV[i + 1]
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 'f', 'cx', 't', 'd', 'r', 'ca')
  if j[1] ~= 'active' or j[2] ~= fence then
    out[#out + 1] = STALE_LEASE
  else
    local tenant = j[4]
    local e = ended[tenant]
    if not e then
      e = {ids = {}, succeeded = 0}
      ended[tenant] = e
      ended_tenants[#ended_tenants + 1] = tenant
    end
    e.ids[#e.ids + 1] = id
    if j[3] == '1' then
      redis.call('HSET', job, 's', 'cancelled', 'fa', now_s)
      to_outbox(id, now) -- its worker may have committed a succeeded row: the loop settles it
      out[#out + 1] = CANCELLED
    else
      redis.call('HSET', job, 's', 'succeeded', 'fa', now_s)
      e.succeeded = e.succeeded + 1
      out[#out + 1] = OK
    end
    redis.call('PEXPIRE', job, retention)
    job_ended(id, job, tenant, now, dedupe_ttl, {j[5], j[6], j[7]})
  end
end
local leases = {}
for _, tenant in ipairs(ended_tenants) do
  local e = ended[tenant]
  chunked('ZREM', k_tactive(tenant), e.ids)
  for _, id in ipairs(e.ids) do leases[#leases + 1] = id end
  local counts = k_counts(tenant)
  if e.succeeded > 0 then redis.call('HINCRBY', counts, 'succeeded', int_s(e.succeeded)) end
  unpark_if_below_cap(tenant, redis.call('HINCRBY', counts, 'active', int_s(-#e.ids)))
end
if #leases > 0 then chunked('ZREM', k_leases(), leases) end
settle()
return out
