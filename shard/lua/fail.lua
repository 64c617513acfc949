-- Record failed attempts: back to its tenant's delayed ZSET for a retry after a backoff, or to the
-- tenant's dead-letter set when attempts are used up or the failure is permanent. The backoff
-- is computed here, the one place it is (shard/backoff.py): after attempt n ('at') the wait is
-- w = min(cap, base * 2^(n-1)) (exponent at most 40), then w - w * jitter * draw; the policy is
-- the job's own ('rb', each field 0 = unset) over the caller's (the handler's, or the server
-- default); the random draw is the caller's, so this script stays deterministic. The retry's
-- run-at is the shard's now plus the wait.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, leases, tactive, due,
--                                              tscheduled, dead, counts, promoter_wake, limits,
--                                              parked, paused, tqpaused, tqueues, qring,
--                                              inring, wake, outbox keys
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  retention_ms              (int)     how long a job cancelled meanwhile is kept
-- ARGV[3]  dedupe_ttl_ms             (int)     the window of a tenant whose limits:{t} has no
--                                              'dedupe', for the dedupe key written at a job's
--                                              end (_lib.lua, dedupe_after_end)
-- ARGV[4..] 8 entries per job (a Failure); "-> 'x'" names the job hash field it is stored in
--   job_id                           (string)  the hash's key {prefix}:job:{job_id}
--   fence                            (int)     must equal 'f' (the lease's token)
--   error                            (string)  -> 'e'
--   retry_in_ms                      (int, ms) -1: the backoff above; else this wait (a
--                                              handler's RetryLater). 'ra' = now + the wait
--                                              when retried (and the delayed ZSET score)
--   permanent                        (0 | 1)   1 = dead now, whatever attempts remain (not while
--                                              the attempt is uncounted: store_retries_max)
--   policy                           (string)  "<base_ms> <cap_ms> <jitter>", every field set
--   draw                             (float)   uniform in [0, 1): the jitter's random draw
--   store_retries_max                (int)     0: the attempt counts. n > 0: it failed for
--                                              want of the results database; while 'sr' < n
--                                              it is handed back uncounted ('at' - 1, 'sr' + 1,
--                                              the backoff of attempt 'sr'), never dead; else
--                                              it counts, and a job that so ends dead goes to
--                                              the outbox (its worker wrote no row for it)
-- A job that ends (dead, cancelled) also gets 'fa' = now_ms and its payload leaves
-- counts:{t} 'bytes'; 's' is set to the state returned. A tenant parked at its max_active is
-- un-parked once below it.
-- Returns  one {code, state} per job (FailResult), state being 's' after the call: OK with
--          'scheduled' or 'dead' | CANCELLED (cancel was requested while it ran)
--          | STALE_LEASE (nothing changed; the job's 's', '' when there is no job)
local function policy_of(s)
  local b, c, j = string.match(s, '^(%S+) (%S+) (%S+)$')
  return tonumber(b), tonumber(c), tonumber(j)
end

-- The wait after attempt `attempt` failed: the job's own policy ('rb') over `policy`.
local function backoff_ms(own, policy, draw, attempt)
  local base, cap, jitter = policy_of(policy)
  if own then
    local b, c, j = policy_of(own)
    if b > 0 then base = b end
    if c > 0 then cap = c end
    if j > 0 then jitter = j end
  end
  local wait = math.min(cap, base * 2 ^ math.min(math.max(attempt, 1) - 1, 40))
  return math.floor(wait - wait * jitter * draw)
end

local now, retention, dedupe_ttl = shard_now(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV, 8 do
  local id, fence, err = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local retry_in, permanent = tonumber(ARGV[i + 3]), ARGV[i + 4] == '1'
  local store_max = tonumber(ARGV[i + 7])
  local job = k_job(id)
  local j = redis.call('HMGET', job, 's', 'f', 'cx', 't', 'at', 'ma', 'rb', 'sr')
  if j[1] ~= 'active' or j[2] ~= fence then
    out[#out + 1] = {STALE_LEASE, j[1] or ''}
  else
    local tenant = j[4]
    end_lease(id, tenant)
    redis.call('HINCRBY', k_counts(tenant), 'failed', 1)
    if j[3] == '1' then
      redis.call('HSET', job, 's', 'cancelled', 'fa', now, 'e', err)
      redis.call('PEXPIRE', job, retention)
      job_ended(id, job, tenant, now, dedupe_ttl)
      to_outbox(id, now) -- its worker writes no row for a failure: the shard loop does
      out[#out + 1] = {CANCELLED, 'cancelled'}
    else
      local attempt = tonumber(j[5])
      local uncounted = store_max > 0 and tonumber(j[8] or 0) < store_max
      if uncounted then
        redis.call('HINCRBY', job, 'at', -1)
        attempt = redis.call('HINCRBY', job, 'sr', 1) -- the backoff grows with these
      end
      if not uncounted and (permanent or attempt >= tonumber(j[6] or UNSTORED_MAX_ATTEMPTS)) then
        redis.call('HSET', job, 's', 'dead', 'fa', now, 'e', err)
        push_dead(id, tenant, now)
        job_ended(id, job, tenant, now, dedupe_ttl)
        if store_max > 0 then to_outbox(id, now) end
        out[#out + 1] = {OK, 'dead'}
      else
        if retry_in < 0 then
          retry_in = backoff_ms(j[7], ARGV[i + 5], tonumber(ARGV[i + 6]), attempt)
        end
        local retry_at = now + retry_in
        redis.call('HSET', job, 's', 'scheduled', 'ra', retry_at, 'e', err)
        push_scheduled(id, tenant, retry_at)
        redis.call('HINCRBY', k_counts(tenant), 'scheduled', 1)
        out[#out + 1] = {OK, 'scheduled'}
      end
    end
  end
end
settle()
return out
