-- Claim up to N ready jobs: the highest priority first; within a priority, tenants in
-- round-robin (a tenant of weight w gets w jobs per turn). Each claim takes a new fencing
-- token and a lease. O(1) per job in the number of tenants and jobs.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, ready, ring, credit, tactive, counts
-- KEYS[2]  {prefix}:fence            (STRING)  fencing-token counter
-- KEYS[3]  {prefix}:leases           (ZSET)    job_id scored by lease deadline (unix ms)
-- KEYS[4]  {prefix}:weights          (HASH)    tenant -> jobs per round-robin turn
-- ARGV[1]  now_ms                    (int)     caller's clock, unix ms
-- ARGV[2]  lease_ms                  (int)     lease length granted by this claim
-- ARGV[3]  max_jobs                  (int)     most jobs to claim
-- ARGV[4]  worker_id                 (string)  -> job hash field 'w' of each claimed job
-- Each claimed job's hash gets 's' = 'active', 'f' = its new fence, 'sa' = now_ms, 'at' + 1.
-- Returns  a flat list, 12 entries per claimed job (ClaimedJob.from_reply in shard/records.py):
--          entry j of job k = 0, 1, ... is reply[k*12+j]; "<- 'x'" names the hash field read
--   j=1   job_id           (string)          the hash's key {prefix}:job:{job_id}
--   j=2   fence            (int)             <- 'f' (the token this claim took)
--   j=3   tenant           (string)          <- 't'
--   j=4   request_id       (string)          <- 'r'
--   j=5   handler          (string)          <- 'h'
--   j=6   payload          (bytes)           <- 'p'
--   j=7   priority         (int 0-9)         <- 'pr'
--   j=8   run_at_ms        (int, unix ms)    <- 'ra'
--   j=9   created_at_ms    (int, unix ms)    <- 'ca'
--   j=10  attempt          (int)             <- 'at' (this claim counted: 1 for a first run)
--   j=11  max_attempts     (int)             <- 'ma'
--   j=12  timeout_ms       (int, ms)         <- 'to'
-- When the batch filled up and work remains, one wake-up token is left for another worker.
local now, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_jobs, worker = tonumber(ARGV[3]), ARGV[4]
local deadline = now + lease_ms
local out = {}
local claimed = 0
-- Lazily removed (cancelled) IDs popped on the way; capped so one call stays short.
local skipped, MAX_SKIP = 0, 1000

-- Rotate the ring after serving `tenant` once; drop it when its list is empty.
local function advance(ring, prio, tenant, remaining)
  if remaining == 0 then
    redis.call('LPOP', ring)
    redis.call('HDEL', k_credit(prio), tenant)
    return
  end
  local w = tonumber(redis.call('HGET', KEYS[4], tenant) or '1') or 1
  if w > 1 and redis.call('HINCRBY', k_credit(prio), tenant, 1) < w then return end
  if w > 1 then redis.call('HDEL', k_credit(prio), tenant) end
  redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
end

for prio = 9, 0, -1 do
  local ring = k_ring(prio)
  while claimed < max_jobs and skipped < MAX_SKIP do
    local tenant = redis.call('LINDEX', ring, 0)
    if not tenant then break end
    local rkey = k_ready(tenant, prio)
    local id = redis.call('LPOP', rkey)
    advance(ring, prio, tenant, redis.call('LLEN', rkey))
    local job = id and k_job(id)
    if id and redis.call('HGET', job, 's') == 'ready' then
      local fence = redis.call('INCR', KEYS[2])
      local attempts = redis.call('HINCRBY', job, 'at', 1)
      redis.call('HSET', job, 's', 'active', 'f', fence, 'w', worker, 'sa', now)
      redis.call('ZADD', KEYS[3], deadline, id)
      redis.call('ZADD', k_tactive(tenant), now, id)
      redis.call('HINCRBY', k_counts(tenant), 'ready', -1)
      redis.call('HINCRBY', k_counts(tenant), 'active', 1)
      local f = redis.call('HMGET', job, 'r', 'h', 'p', 'pr', 'ra', 'ca', 'ma', 'to')
      local n = #out
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, fence, tenant, f[1]
      out[n + 5], out[n + 6], out[n + 7], out[n + 8] = f[2], f[3], f[4], f[5]
      out[n + 9], out[n + 10], out[n + 11], out[n + 12] = f[6], attempts, f[7], f[8]
      claimed = claimed + 1
    else
      skipped = skipped + 1
    end
  end
  if claimed >= max_jobs or skipped >= MAX_SKIP then break end
end

if claimed >= max_jobs or skipped >= MAX_SKIP then
  for prio = 9, 0, -1 do
    if redis.call('LLEN', k_ring(prio)) > 0 then
      wake_workers()
      break
    end
  end
end
return out
