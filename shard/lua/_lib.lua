-- Shared helpers: each script of this folder is sent with the definitions here that it uses,
-- directly or through others, before it (shard/scripts.py, link). Each definition is one
-- top-level `local` statement at the start of a line, with the comment lines just above it;
-- a multi-line body is indented up to its `end`, with no blank line in it. KEYS[1] is always
-- the key prefix plus ':' (Keys.base()); per-tenant and per-queue keys that a script only
-- discovers while it runs are derived from it here, spelled exactly as in shard/keys.py
-- (tests/unit/test_keys.py checks that both agree).
local base = KEYS[1]
local function k_job(id) return base .. 'job:' .. id end
local function k_due() return base .. 'due' end
local function k_tscheduled(t) return base .. 'tscheduled:' .. t end
local function k_tactive(t) return base .. 'tactive:' .. t end
local function k_ready(t, q, prio) return base .. 'ready:' .. t .. ':' .. q .. ':' .. prio end
local function k_tprio(t, q) return base .. 'tprio:' .. t .. ':' .. q end
local function k_tqueues(t) return base .. 'tqueues:' .. t end
local function k_ring(q) return base .. 'qring:' .. q end
local function k_inring(q) return base .. 'inring:' .. q end
local function k_credit(q) return base .. 'qcredit:' .. q end
local function k_limits(t) return base .. 'limits:' .. t end
local function k_paused() return base .. 'paused' end
local function k_qpaused() return base .. 'qpaused' end
local function k_tqpaused() return base .. 'tqpaused' end
local function k_parked() return base .. 'parked' end
local function k_leases() return base .. 'leases' end
local function k_fence() return base .. 'fence' end
local function k_dead(t) return base .. 'dead:' .. t end
local function k_dedupe(t, rid) return base .. 'dedupe:' .. t .. ':' .. rid end
local function k_counts(t) return base .. 'counts:' .. t end
local function k_tenants() return base .. 'tenants' end
local function k_bucket(t) return base .. 'bucket:' .. t end
local function k_wake(q) return base .. 'wake:' .. q end
local function k_promoter_wake() return base .. 'promoter_wake' end
local function k_schedules(t) return base .. 'schedules:' .. t end
local function k_cron() return base .. 'cron' end
local function k_map_fence() return base .. 'mapfence' end
local function k_job_format() return base .. 'jobformat' end
local function k_moving(t) return base .. 'moving:' .. t end
local function k_moving_schedules(t) return base .. 'movingsched:' .. t end
local function k_moved_counts(t) return base .. 'movedcounts:' .. t end
local function k_outbox() return base .. 'outbox' end
-- The previous layout (one queue; rings per priority), read only by upgrade_layout.lua.
local function k_old_ready(t, prio) return base .. 'ready:' .. t .. ':' .. prio end
local function k_old_ring(prio) return base .. 'ring:' .. prio end
local function k_old_credit(prio) return base .. 'credit:' .. prio end
local function k_old_weights() return base .. 'weights' end
local function k_old_wake() return base .. 'wake' end
-- The delayed ZSET of every job of the shard (before `due`), read only by promote.lua.
local function k_old_scheduled() return base .. 'scheduled' end

-- The queue of a job hash without field 'q'.
local DEFAULT_QUEUE = 'default'
-- A job hash may lack a field at its usual value: 'q' (above), 'pr', 'at' and 'f' at 0, 'ma'
-- and 'to' at these (shard/records.py: UNSTORED_*). Read them with `or`. enqueue.lua leaves
-- out 'q', 'at' and 'f'; 'pr', 'ma' and 'to' only on a shard whose job format (k_job_format,
-- raised by `shardq shards finalize` once no pod of an older release runs) is at least
-- COMPACT_FORMAT (docs/deploying.md, "Upgrading").
local UNSTORED_MAX_ATTEMPTS = '5'
local UNSTORED_TIMEOUT_MS = '300000'
local COMPACT_FORMAT = 2
-- From this job format on, enqueue.lua gives a job the ID derived_id(tenant, request_id) and
-- writes no dedupe key: the job's hash, with the digest in 'd', is its request ID's dedupe
-- record while it lives (shard/records.py, FOLDED_FORMAT).
local FOLDED_FORMAT = 3

-- A whole number (a time in ms, a count) as the string Redis would store for it. Given a Lua
-- number, redis.call writes it out with snprintf("%.17g"), which costs several times this:
-- claim.lua's four per job were 7% of the server's instructions per claimed job, ack.lua's
-- 10% per acked one (bench/script_instructions.py).
local function int_s(n) return string.format('%d', n) end

-- The table under `key` in table `t`, made empty there if there is none: a script's
-- per-tenant (per-queue, ...) gatherings.
local function table_at(t, key)
  local v = t[key]
  if not v then
    v = {}
    t[key] = v
  end
  return v
end

-- The ID of the job of (tenant, request_id) at FOLDED_FORMAT (records.derived_job_id).
local function derived_id(t, rid)
  return string.sub(redis.sha1hex(t .. ':' .. rid), 1, 26)
end

-- The tenants' own dedupe windows (s; false: none), read once per script: an ack of 500 jobs
-- has few tenants, and an HGET per job was a fifth of what the key costs an ack.
local dedupe_windows = {}

-- When a job of FOLDED_FORMAT (one with 'd') ends, its request ID keeps a dedupe key for what
-- is left of its window (from its submit): the hash alone may expire sooner (its retention)
-- and is not found by a tenant's move (the mover SCANs the tenant's dedupe keys). Below that
-- format the key was written at submit. `default_ttl`: the window of a tenant whose limits:{t}
-- has no 'dedupe', ms (ShardSettings.dedupe_ttl_ms, each ending script's ARGV). `f`: the
-- hash's {'d', 'r', 'ca'}, or nil to read them here.
local function dedupe_after_end(id, job, tenant, now, default_ttl, f)
  f = f or redis.call('HMGET', job, 'd', 'r', 'ca')
  if not f[1] then return end
  local window = dedupe_windows[tenant]
  if window == nil then
    window = tonumber(redis.call('HGET', k_limits(tenant), 'dedupe') or '') or false
    dedupe_windows[tenant] = window
  end
  local left = (window and window * 1000 or default_ttl) - (now - (tonumber(f[3]) or now))
  if left > 0 then
    redis.call('SET', k_dedupe(tenant, f[2]), id .. ' ' .. f[1], 'PX', int_s(left))
  end
end

-- Most wake-up tokens kept for idle workers of a queue; more would only cause empty claims.
local WAKE_CAP = 64

-- LPUSH answers the list's length: trimmed only when it passed the cap, a command saved at
-- nearly every call.
local function wake_workers(q)
  local wake = k_wake(q)
  if redis.call('LPUSH', wake, '1') > WAKE_CAP then redis.call('LTRIM', wake, 0, WAKE_CAP - 1) end
end

-- Wake the shard loop when `at` comes before everything in `zset` (it sleeps until then).
local function wake_promoter_if_first(zset, at)
  local first = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
  if first[2] == nil or at < tonumber(first[2]) then
    local wake = k_promoter_wake()
    if redis.call('LPUSH', wake, '1') > 1 then redis.call('LTRIM', wake, 0, 0) end
  end
end

-- A tenant's place on `due`: at `at`, unless it is there earlier already (ZADD LT keeps the
-- lower score), so its score stays at or before its earliest scheduled run-at.
local function due_by(tenant, at)
  redis.call('ZADD', k_due(), 'LT', at, tenant)
end

-- What a script does once at its end (settle()), not per job: the queues whose workers it
-- wakes; per tenant the change of its pending payload bytes, and the earliest run-at of the
-- jobs it put on the tenant's delayed ZSET (the tenant's place on `due`).
local to_wake = {}
local bytes_delta = {}
local due_at = {}

local function add_bytes(t, n)
  bytes_delta[t] = (bytes_delta[t] or 0) + n
end

-- A job of `tenant` put on its delayed ZSET at `run_at`: the tenant's earliest at settle().
local function note_due(tenant, run_at)
  local at = due_at[tenant]
  if at == nil or run_at < at then due_at[tenant] = run_at end
end

-- Put a job on its tenant's delayed ZSET. At settle() the tenant goes on `due` by the earliest
-- of its jobs put there, and the shard loop is woken if that is before every job it knew of.
-- One ZSET entry per job: the shard-wide order is the tenants' (few) entries on `due`.
local function push_scheduled(id, tenant, run_at)
  redis.call('ZADD', k_tscheduled(tenant), run_at, id)
  note_due(tenant, run_at)
end

-- The end of every script that makes jobs ready or moves them into or out of the pending
-- states. The 'bytes' gauge never goes below 0 (jobs of a shard upgraded from the previous
-- layout were never counted in it).
local function settle()
  for t, n in pairs(bytes_delta) do
    if n ~= 0 and redis.call('HINCRBY', k_counts(t), 'bytes', n) < 0 then
      redis.call('HSET', k_counts(t), 'bytes', 0)
    end
  end
  local soonest = nil
  for _, at in pairs(due_at) do
    if soonest == nil or at < soonest then soonest = at end
  end
  if soonest ~= nil then
    wake_promoter_if_first(k_due(), soonest)
    for t, at in pairs(due_at) do due_by(t, at) end
  end
  for q in pairs(to_wake) do wake_workers(q) end
end

-- Put the tenant at the end of the queue's ring unless it is on it already.
local function ring_tenant(t, q)
  if redis.call('SADD', k_inring(q), t) == 1 then redis.call('RPUSH', k_ring(q), t) end
end

-- A ready list that was empty has a job again: its priority joins the tenant's priorities in
-- the queue (tprio), the queue the tenant's queues, and the tenant the queue's ring.
local function list_started(t, q, prio)
  redis.call('ZADD', k_tprio(t, q), prio, prio)
  redis.call('SADD', k_tqueues(t), q)
  ring_tenant(t, q)
end

-- Append a job to its tenant's ready list of its queue and priority. A list that was empty
-- adds the priority to the tenant's priorities in the queue (tprio) and the queue to its
-- queues (tqueues), and puts the tenant on the queue's ring (claim drops it lazily there if it
-- is paused or parked).
local function push_ready(id, t, q, prio)
  prio = prio or '0' -- a job hash without 'pr' is at priority 0
  if redis.call('RPUSH', k_ready(t, q, prio), id) == 1 then list_started(t, q, prio) end
  to_wake[q] = true
end

-- Put a tenant that may be served again (resumed, un-parked) back on the ring of each queue
-- where it has ready jobs and that is not paused for it alone, and wake those queues'
-- workers. Nothing while it is still paused whole or parked. O(queues it has ready jobs in).
local function rering(t)
  if redis.call('SISMEMBER', k_paused(), t) == 1 or redis.call('SISMEMBER', k_parked(), t) == 1 then
    return
  end
  for _, q in ipairs(redis.call('SMEMBERS', k_tqueues(t))) do
    if redis.call('SISMEMBER', k_tqpaused(), t .. '/' .. q) == 0 then
      ring_tenant(t, q)
      to_wake[q] = true
    end
  end
end

-- Whether any tenant is parked, read once per script (only claim.lua and set_limits.lua park).
local any_parked = nil

-- Un-park a parked tenant whose active jobs are now below its max_active (or that has no cap).
local function unpark_if_below_cap(t, active)
  if any_parked == nil then any_parked = redis.call('SCARD', k_parked()) > 0 end
  if not any_parked or redis.call('SISMEMBER', k_parked(), t) == 0 then return end
  local cap = tonumber(redis.call('HGET', k_limits(t), 'max_active') or '0') or 0
  if cap == 0 or active < cap then
    redis.call('SREM', k_parked(), t)
    rering(t)
  end
end

-- After jobs left a tenant's delayed ZSET other than by promote (cancel, move): off `due` when
-- it has none left. Else its score stays, earlier than its earliest job now perhaps: promote
-- finds nothing due for it then and sets the score right (a score is a lower bound, never late).
local function undue_if_empty(tenant)
  if redis.call('EXISTS', k_tscheduled(tenant)) == 0 then redis.call('ZREM', k_due(), tenant) end
end

local function push_dead(id, tenant, now)
  redis.call('ZADD', k_dead(tenant), now, id)
  redis.call('HINCRBY', k_counts(tenant), 'dead', 1)
end

-- The job ended dead or cancelled with no worker writing its result row: the shard loop
-- writes it (shard/rows.py). In the same script as the state change, so no crash loses it.
local function to_outbox(id, now)
  redis.call('ZADD', k_outbox(), now, id)
end

-- The job leaves scheduled/ready/active for good (done, dead, cancelled, moved away): its
-- payload no longer counts in the tenant's 'bytes' (at settle()).
local function uncount_bytes(job, tenant)
  add_bytes(tenant, -redis.call('HSTRLEN', job, 'p'))
end

-- The job ended (succeeded, dead, cancelled): uncount_bytes, and the dedupe key of a job of
-- FOLDED_FORMAT (dedupe_after_end). `default_ttl`: each ending script's dedupe_ttl_ms. `f`:
-- the hash's {'d', 'r', 'ca'} when the caller read them with its own fields, else nil.
local function job_ended(id, job, tenant, now, default_ttl, f)
  uncount_bytes(job, tenant)
  dedupe_after_end(id, job, tenant, now, default_ttl, f)
end

-- Ends an active job's lease: off the lease ZSETs, one fewer active; a tenant parked at its
-- max_active is un-parked (back on its rings, workers woken) once below it.
local function end_lease(id, tenant)
  redis.call('ZREM', k_leases(), id)
  redis.call('ZREM', k_tactive(tenant), id)
  unpark_if_below_cap(tenant, redis.call('HINCRBY', k_counts(tenant), 'active', '-1'))
end

-- The shard's clock, unix ms: one clock for every time a job records (created, run-at, started,
-- finished) and every lease deadline, whichever machine called. `arg` is a script's now_ms
-- ARGV entry: "0" (ShardClient on the system clock) reads Redis TIME, once per call; any other
-- value is used as given (tests drive time with a FakeClock). TIME before writes is allowed
-- since Redis 5 replicates a script's effects, not the script (7.0 knows nothing else).
local function shard_now(arg)
  local given = tonumber(arg) or 0
  if given > 0 then return given end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Codes shared with shard/codes.py (ItemCode).
local OK, DEDUPLICATED, CONFLICT, OVER_QUOTA, RATE_LIMITED = 0, 1, 2, 3, 4
local STALE_LEASE, CANCEL_REQUESTED, NOT_FOUND, ALREADY_TERMINAL, CANCELLED = 5, 6, 7, 8, 9
local STALE_MAP, MOVING = 10, 11

-- `cmd key member...` for every member of `list`, 1000 at a call (Lua's unpack has a limit).
local function chunked(cmd, key, list)
  local n = 0
  for s = 1, #list, 1000 do
    n = n + redis.call(cmd, key, unpack(list, s, math.min(s + 999, #list)))
  end
  return n
end
