-- Enqueue a batch of jobs (any tenants of this shard): ready now, or scheduled for later.
-- Idempotent per (tenant, request_id) for the dedupe window; per-tenant quota and rate checked
-- atomically with the write, so a refused job writes nothing.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, ready, tprio, tqueues, qring,
--                                              inring, due, tscheduled, dedupe, counts,
--                                              limits, bucket, tenants, mapfence,
--                                              jobformat, wake, promoter_wake, outbox,
--                                              dead keys
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  dedupe_ttl_ms             (int)     how long a request_id stays deduplicated, for
--                                              a tenant whose limits:{t} has no 'dedupe' (s)
-- ARGV[3]  map_version               (int)     shard-map version the caller routed with; 0 for
--                                              the shard's own loop (cron), never refused
-- ARGV[4..] 15 entries per job (PreparedJob.to_argv in shard/records.py): entry j of job
--          k = 0, 1, ... is ARGV[3+k*15+j]; "-> 'x'" names the job hash field it is stored in
--   j=1   tenant           (string)          -> 't'
--   j=2   job_id           (string)          the hash's key {prefix}:job:{job_id}; at
--          FOLDED_FORMAT or more not used: the ID is derived_id(tenant, request_id) (_lib.lua)
--   j=3   request_id       (string)          -> 'r' (and the dedupe key's name)
--   j=4   handler          (string)          -> 'h'
--   j=5   payload          (bytes)           -> 'p'
--   j=6   priority         (int 0-9)         -> 'pr' (*)
--   j=7   run_at_ms        (int, unix ms)    -> 'ra'; '' for none: 'ra' = now + delay_ms
--   j=8   delay_ms         (int, ms)         used when run_at_ms is '' (0: due now)
--   j=9   max_attempts     (int)             -> 'ma' (*)
--   j=10  timeout_ms       (int, ms)         -> 'to' (*)
--   j=11  digest           (string)          -> 'd' at FOLDED_FORMAT or more; below it, kept
--                                              in the dedupe key's value (of handler+payload)
--   j=12  queue            (string)          -> 'q' (not stored for 'default')
--   j=13  limit_defaults   (string)          "<max_pending> <max_pending_bytes> <rate> <burst>":
--          the caller's defaults of limits:{t} 'max_pending' (0 = none), 'max_pending_bytes'
--          (bytes, 0 = none), 'rate' (float, per s, 0 = no limit) and 'burst' (0 = max(1,
--          rate)), used where the tenant's limits:{t} hash has no such field; none is stored.
--          A job made here also gets 's' = 'ready' (or 'scheduled' when its run-at > now)
--          and 'ca' = now ('at' and 'f', 0 until its first claim, are not stored); its
--          payload's length is added to counts:{t} 'bytes'.
--   j=14  retry            (string)          -> 'rb': "<base_ms> <max_ms> <jitter>", the job's
--          own retry policy (fail.lua); '' for none, and then nothing is stored
--   j=15  trace_context    (string)          -> 'tc': the submitter's W3C trace context
--          (shardq.common.tracing); '' for none, and then nothing is stored
--   (*) not stored at its usual value (0, 5, 300000) once the shard's job format
--       (jobformat, job_format.lua) is COMPACT_FORMAT or more
-- Below FOLDED_FORMAT a job made here gets a dedupe key for the window; at it, none: its hash
-- at the derived ID is the record while it lives, and its end writes the key for what is left
-- of the window (dedupe_after_end). A request ID is deduplicated by its dedupe key (either
-- format's) or by a live job at its derived ID: for the window, and past it while its job has
-- not ended. An ended job there whose key is gone (its window passed) is replaced by the new
-- one (a dead one leaves dead:{t}), unless it still waits on the outbox for its row.
-- Returns  one flat list (EnqueueResult.from_reply): the shard's now (ms), then three entries
--          per job, in order: code, job_id (the hash's key; '' when there is no job), and
--   OK: the run-at of the job this call made ('ra'); its 'ca' is now, its state 'scheduled'
--       when the run-at is after now, else 'ready'
--   | DEDUPLICATED (job_id of the first job): its state, or '' if it expired
--   | CONFLICT (same request_id, other handler/payload; job_id of the first): its state
--   | OVER_QUOTA (max_pending or max_pending_bytes reached): the ms to retry after, 1000
--   | RATE_LIMITED: the ms to retry after, until the bucket holds a token
--   | STALE_MAP for every job when map_version is below the shard's map fence (a tenant is
--     moving off this shard): nothing written; the map version needed
--   Flat, and three entries where a job made here has six values: a table per job and its
--   six values were 6% of the server's instructions per job (bench/enqueue_parts.py).
local now = shard_now(ARGV[1])
-- Times go to Redis as strings made here (int_s): a Lua number given to redis.call is written
-- out by Redis with snprintf("%.17g"), which was 8% of the whole server's instructions per job
-- for 'ra' and 'ca' (bench/enqueue_parts.py --instructions). Every time here is whole.
local now_s = int_s(now)
local ttl = tonumber(ARGV[2])
local map_version = tonumber(ARGV[3])
local STRIDE = 15
local FIRST = 4
local out = {now}

-- The shard's map fence and job format, in one read.
local shard_state = redis.call('MGET', k_map_fence(), k_job_format())
if map_version > 0 then
  local needed = tonumber(shard_state[1] or '0')
  if map_version < needed then
    for _ = FIRST, #ARGV, STRIDE do
      out[#out + 1], out[#out + 2], out[#out + 3] = STALE_MAP, '', needed
    end
    return out
  end
end
-- Leave 'pr', 'ma' and 'to' out at their usual values, and fold the dedupe key into the job
-- hash: each only once every pod reads it.
local job_format = tonumber(shard_state[2] or '1')
local compact = job_format >= COMPACT_FORMAT
local folded = job_format >= FOLDED_FORMAT

-- limits:{t} per tenant of the batch, read once: {max_pending, max_pending_bytes, rate, burst,
-- dedupe (s)}.
local limits = {}
-- Per tenant of the batch, the jobs this call made ready and scheduled: counts:{t} and the
-- shard's tenant set are written once per tenant at the end, not per job (over_quota adds
-- these in meanwhile).
local made = {}
local function limits_of(tenant)
  local l = limits[tenant]
  if not l then
    l = redis.call('HMGET', k_limits(tenant), 'max_pending', 'max_pending_bytes', 'rate', 'burst',
      'dedupe')
    limits[tenant] = l
  end
  return l
end

-- Per tenant of the batch, {pending jobs, pending bytes} as counts:{t} held them when this
-- call began: read once. Nothing else writes those fields while the script runs, and what it
-- adds itself is in `made` and bytes_delta until settle(). An HMGET per job was a fifth of
-- the server's instructions per job of a SubmitJobs call, whose jobs all carry the
-- coordinator's default max_pending (bench/enqueue_parts.py --coordinator-limits).
local counts_at_start = {}

-- OVER_QUOTA when one more job of `size` bytes would pass max_pending or max_pending_bytes.
local function over_quota(tenant, max_pending, max_bytes, size)
  if max_pending <= 0 and max_bytes <= 0 then return false end
  local c = counts_at_start[tenant]
  if not c then
    local r = redis.call('HMGET', k_counts(tenant), 'scheduled', 'ready', 'active', 'bytes')
    c = {(tonumber(r[1]) or 0) + (tonumber(r[2]) or 0) + (tonumber(r[3]) or 0), tonumber(r[4]) or 0}
    counts_at_start[tenant] = c
  end
  local pending = c[1]
  local m = made[tenant]
  if m then pending = pending + m.ready + m.scheduled end
  if max_pending > 0 and pending >= max_pending then return true end
  return max_bytes > 0 and c[2] + (bytes_delta[tenant] or 0) + size > max_bytes
end

-- Per tenant of the batch that takes tokens, its bucket as this call leaves it: {tokens, ts,
-- PEXPIRE ms}. Read once, taken from per job, written once at the end (write_buckets): an
-- HMGET, an HSET and a PEXPIRE per job were a quarter of the server's instructions per job of
-- a tenant whose submits are rate limited (bench/enqueue_parts.py --rate-limit).
local buckets = {}

-- Takes a token from the tenant's bucket (refilled continuously at `rate` per s, holding at
-- most `burst`); returns 0, or the ms until a token is there. Each job reads the bucket as the
-- job before it left it, as if it had been written and read back.
local function take_token(tenant, rate, burst)
  if burst <= 0 then burst = math.max(1, rate) end
  local b = buckets[tenant]
  if not b then
    local r = redis.call('HMGET', k_bucket(tenant), 'tokens', 'ts')
    b = {r[1], r[2]}
    buckets[tenant] = b
  end
  local tokens, ts = tonumber(b[1]) or burst, tonumber(b[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
  local wait = 0
  if tokens < 1 then
    wait = math.ceil((1 - tokens) * 1000 / rate)
  else
    tokens = tokens - 1
  end
  -- As stored: tostring() keeps 14 digits. A whole number of fewer comes back as it was,
  -- and is left as it is (tostring() per job was 7% of a rate-limited job's instructions).
  if tokens % 1 ~= 0 or tokens >= 1e14 then tokens = tonumber(tostring(tokens)) end
  b[1], b[2], b[3] = tokens, now, math.ceil(burst * 1000 / rate) + 1000
  return wait
end

local function write_buckets()
  for tenant, b in pairs(buckets) do
    local bucket = k_bucket(tenant)
    redis.call('HSET', bucket, 'tokens', tostring(b[1]), 'ts', b[2])
    redis.call('PEXPIRE', bucket, b[3])
  end
end

-- The states a job does not leave but by a requeue (of a dead one).
local ENDED = {succeeded = true, cancelled = true, dead = true}

-- What push_ready and push_scheduled (_lib.lua) do, a batch at a time: here, not in _lib.lua,
-- since only this script uses these.
--
-- Ready jobs of this script gathered per ready list, in the order the lists are first met, and
-- pushed by push_gathered with one RPUSH per list: an RPUSH per job, with its key built, was
-- 6% of the instructions of a job enqueue.lua makes (bench/enqueue_parts.py --instructions).
local gathered = {}
local gathered_at = {} -- tenant -> queue -> priority -> entry of `gathered`

local function gather_ready(id, t, q, prio)
  prio = prio or '0'
  local by_prio = table_at(table_at(gathered_at, t), q)
  local e = by_prio[prio]
  if not e then
    e = {t, q, prio, {}}
    by_prio[prio] = e
    gathered[#gathered + 1] = e
  end
  local ids = e[4]
  ids[#ids + 1] = id
end

-- Scheduled jobs of this script gathered per tenant, in the order the tenants are first met,
-- and put on each tenant's delayed ZSET by push_gathered with one ZADD per tenant: what
-- push_scheduled does, a ZSET at a time (a ZADD per job was 3% of the server's instructions
-- per delayed job enqueue.lua makes). `run_at_s`: run_at as a string (see enqueue.lua's now_s).
local gathered_scheduled = {}
local gathered_scheduled_at = {} -- tenant -> entry of `gathered_scheduled`

local function gather_scheduled(id, tenant, run_at, run_at_s)
  local e = gathered_scheduled_at[tenant]
  if not e then
    e = {tenant, {}}
    gathered_scheduled_at[tenant] = e
    gathered_scheduled[#gathered_scheduled + 1] = e
  end
  local scored = e[2]
  scored[#scored + 1], scored[#scored + 2] = run_at_s, id
  note_due(tenant, run_at)
end

-- What push_ready and push_scheduled do for each gathered job, a list or a ZSET at a time.
local function push_gathered()
  for _, e in ipairs(gathered_scheduled) do
    local key, scored = k_tscheduled(e[1]), e[2]
    for s = 1, #scored, 1000 do -- Lua's unpack has a limit
      redis.call('ZADD', key, unpack(scored, s, math.min(s + 999, #scored)))
    end
  end
  for _, e in ipairs(gathered) do
    local t, q, prio, ids = e[1], e[2], e[3], e[4]
    local len = 0
    for s = 1, #ids, 1000 do -- Lua's unpack has a limit
      len = redis.call('RPUSH', k_ready(t, q, prio), unpack(ids, s, math.min(s + 999, #ids)))
    end
    if len == #ids then list_started(t, q, prio) end -- the list was empty
    to_wake[q] = true
  end
end

-- Each distinct limit_defaults string of the batch, parsed once (a batch's jobs share them).
local parsed_defaults = {}
local function defaults_of(s)
  local d = parsed_defaults[s]
  if not d then
    local mp, mb, rate, burst = string.match(s, '^(%S+) (%S+) (%S+) (%S+)$')
    d = {tonumber(mp), tonumber(mb), tonumber(rate), tonumber(burst)}
    parsed_defaults[s] = d
  end
  return d
end

-- The admission limits in force for a tenant's jobs sent with the limit_defaults string `s`,
-- {max_pending, max_pending_bytes, rate, burst}: its limits:{t} where they are set, else the
-- defaults. Worked out once per tenant and defaults of the batch: per job, the four lookups
-- and tonumber calls were 3% of the server's instructions (bench/enqueue_parts.py).
local in_force = {}
local function limits_in_force(tenant, s)
  local by_defaults = table_at(in_force, tenant)
  local f = by_defaults[s]
  if not f then
    local l, dft = limits_of(tenant), defaults_of(s)
    f = {tonumber(l[1]) or dft[1], tonumber(l[2]) or dft[2], tonumber(l[3]) or dft[3],
      tonumber(l[4]) or dft[4]}
    by_defaults[s] = f
  end
  return f
end

-- ARGV is a global, which Lua looks up by name at each use: a local, once (2% per job).
local argv = ARGV
-- A call of one job (a unary SubmitJob the coalescer found alone) pushes it at once: for one
-- job the gathering's tables cost more than they save (3% of such a call's instructions).
local single = #argv < FIRST + 2 * STRIDE
for i = FIRST, #argv, STRIDE do
  local tenant, id, rid, handler, payload = argv[i], argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4]
  local prio, run_at_s = argv[i + 5], argv[i + 6]
  local run_at = tonumber(run_at_s)
  if not run_at then
    local delay = argv[i + 7]
    if delay == '0' then
      run_at, run_at_s = now, now_s
    else
      run_at = now + tonumber(delay)
      run_at_s = int_s(run_at)
    end
  end
  local max_attempts, timeout_ms, digest, q = argv[i + 8], argv[i + 9], argv[i + 10], argv[i + 11]
  local f = limits_in_force(tenant, argv[i + 12])
  local max_pending, max_bytes, rate, burst = f[1], f[2], f[3], f[4]
  local dkey = k_dedupe(tenant, rid)
  local seen, live, replaced = false, nil, nil
  local job_key
  if folded then
    id = derived_id(tenant, rid)
    job_key = k_job(id)
    -- A request ID not seen before, the usual case, has neither key: one command tells.
    if redis.call('EXISTS', dkey, job_key) > 0 then
      seen = redis.call('GET', dkey)
      if not seen then
        live = redis.call('HMGET', job_key, 'd', 's')
        if ENDED[live[2]] and not redis.call('ZSCORE', k_outbox(), id) then
          replaced, live = live[2], nil
        end
      end
    end
  else
    seen = redis.call('GET', dkey)
    job_key = k_job(id)
  end
  local code, job_id, x -- this job's three entries of the reply
  if seen then
    local first_id, first_digest = string.match(seen, '^(%S+) (%S+)$')
    code, job_id = CONFLICT, first_id
    if first_digest == digest then code = DEDUPLICATED end
    x = redis.call('HGET', k_job(first_id), 's') or ''
  elseif live and live[2] then
    code, job_id, x = CONFLICT, id, live[2]
    if live[1] == digest then code = DEDUPLICATED end
  elseif over_quota(tenant, max_pending, max_bytes, #payload) then
    code, job_id, x = OVER_QUOTA, '', 1000
  else
    local wait = 0
    if rate > 0 then wait = take_token(tenant, rate, burst) end
    if wait > 0 then
      code, job_id, x = RATE_LIMITED, '', wait
    else
      if not folded then
        local window = tonumber(limits_of(tenant)[5])
        redis.call('SET', dkey, id .. ' ' .. digest, 'PX', window and window * 1000 or ttl)
      elseif replaced then
        if replaced == 'dead' then
          redis.call('ZREM', k_dead(tenant), id)
          redis.call('HINCRBY', k_counts(tenant), 'dead', -1)
        elseif replaced == 'cancelled' then
          -- Cancelled while ready, its ID may still be on its ready list (claim drops such
          -- entries lazily): the new job must not be claimed through it, from that queue.
          local old = redis.call('HMGET', job_key, 'q', 'pr')
          redis.call('LREM', k_ready(tenant, old[1] or DEFAULT_QUEUE, old[2] or '0'), 0, id)
        end
        redis.call('DEL', job_key)
      end
      local state = 'ready'
      if run_at > now then state = 'scheduled' end
      -- One HSET, without the fields at 0 until a claim ('at', 'f'; _lib.lua, UNSTORED_*):
      -- a field costs memory per job, and the HSET's time grows with its fields. 'pr', 'ma'
      -- and 'to' are written even at their usual value below the compact format: releases
      -- before e23b590 read a hash without them as an error, and may run beside this one.
      -- The HSET's arguments: the fields every job has, in one table made whole ('d' left
      -- out by n below the folded format), then each other field after n where it is
      -- stored. A table grown a field at a time, through a function call each, was 5% of the
      -- server's instructions per job (bench/enqueue_parts.py --instructions).
      local fields = {'t', tenant, 'r', rid, 'h', handler, 'p', payload, 's', state,
        'ra', run_at_s, 'ca', now_s, 'd', digest}
      local n = 14
      if folded then n = 16 end
      if not compact or prio ~= '0' then fields[n + 1], fields[n + 2], n = 'pr', prio, n + 2 end
      if not compact or max_attempts ~= UNSTORED_MAX_ATTEMPTS then
        fields[n + 1], fields[n + 2], n = 'ma', max_attempts, n + 2
      end
      if not compact or timeout_ms ~= UNSTORED_TIMEOUT_MS then
        fields[n + 1], fields[n + 2], n = 'to', timeout_ms, n + 2
      end
      local retry, trace = argv[i + 13], argv[i + 14]
      if q ~= DEFAULT_QUEUE then fields[n + 1], fields[n + 2], n = 'q', q, n + 2 end
      if retry ~= '' then fields[n + 1], fields[n + 2], n = 'rb', retry, n + 2 end
      if trace ~= '' then fields[n + 1], fields[n + 2], n = 'tc', trace, n + 2 end
      redis.call('HSET', job_key, unpack(fields, 1, n))
      if state == 'ready' then
        if single then
          push_ready(id, tenant, q, prio)
        else
          gather_ready(id, tenant, q, prio)
        end
      else
        gather_scheduled(id, tenant, run_at, run_at_s)
      end
      local m = made[tenant]
      if not m then
        m = {ready = 0, scheduled = 0}
        made[tenant] = m
      end
      m[state] = m[state] + 1
      add_bytes(tenant, #payload)
      code, job_id, x = OK, id, run_at
    end
  end
  out[#out + 1], out[#out + 2], out[#out + 3] = code, job_id, x
end
-- The shard's tenant set gets the batch's tenants in one SADD: a batch of the coalescer's
-- mixes up to one tenant per job.
local tenants = {}
for tenant, m in pairs(made) do
  local counts = k_counts(tenant)
  redis.call('HINCRBY', counts, 'submitted', m.ready + m.scheduled)
  if m.ready > 0 then redis.call('HINCRBY', counts, 'ready', m.ready) end
  if m.scheduled > 0 then redis.call('HINCRBY', counts, 'scheduled', m.scheduled) end
  tenants[#tenants + 1] = tenant
end
if #tenants > 0 then chunked('SADD', k_tenants(), tenants) end
push_gathered()
write_buckets()
settle()
return out
