-- Claim up to N ready jobs from the given queues, one job from each queue in turn (the caller
-- rotates the order between calls). In a queue, tenants first: the tenants with ready jobs
-- take turns (a tenant of weight w gets w jobs per turn); then the tenant's highest priority
-- with a ready job; then FIFO. A tenant's priorities never reorder tenants. Skipped: a queue
-- paused for everyone; a tenant paused whole, paused in the queue, or parked at its
-- max_active (dropped from the ring here, put back by resume or by the end of an active job);
-- a job that this worker handed back for want of its handler until its 'xu' (put back at the
-- tail of its list for another worker). Each claim takes a new fencing token and a lease.
-- O(1) per claimed job in the number of tenants and jobs: one ring read, one ZSET read of at
-- most 10 members, one list pop (plus a few reads per tenant per call).
-- KEYS[1]  {prefix}:                 (prefix)  derives job, ready, tprio, tqueues, qring,
--                                              inring, qcredit, limits, paused, qpaused,
--                                              tqpaused, parked, tactive, counts, wake keys
-- KEYS[2]  {prefix}:fence            (STRING)  fencing-token counter
-- KEYS[3]  {prefix}:leases           (ZSET)    job_id scored by lease deadline (unix ms)
-- ARGV[1]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (tests, on a FakeClock)
-- ARGV[2]  lease_ms                  (int)     lease length granted by this claim
-- ARGV[3]  max_jobs                  (int)     most jobs to claim
-- ARGV[4]  worker_id                 (string)  -> job hash field 'w' of each claimed job
-- ARGV[5..] queues                   (string)  the queues to claim from, in this call's order
-- Reads limits:{t} 'weight' (jobs per turn, absent: 1) and 'max_active' (absent: no cap).
-- Each claimed job's hash gets 's' = 'active', 'f' = its new fence, 'sa' = now_ms (its run-at
-- when later: a job promoted ahead, which its worker starts on it), 'at' + 1,
-- and loses 'xw'/'xu'; its tenant's 'ready' and 'active' gauges move (once per tenant per
-- call). A tenant whose active jobs reach its max_active joins 'parked'.
-- Returns  a flat list, 16 entries per claimed job (ClaimedJob.from_reply in shard/records.py):
--          entry j of job k = 0, 1, ... is reply[k*15+j]; "<- 'x'" names the hash field read
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
--   j=13  queue            (string)          <- 'q' (the queue it was claimed from)
--   j=14  started_at_ms    (int, unix ms)    now: this claim's time ('sa' but for a job
--                                            claimed before its run-at: the worker waits
--                                            run_at_ms - this before starting it)
--   j=15  trace_context    (string)          <- 'tc' ('' when the submitter sent none)
--   j=16  at_once          ('1' or '0')      '1': a first claim ('f' was 0) of a job the shard
--                                            loop did not find done ahead ('ck' is not 'd',
--                                            prechecked.lua): the worker starts it at once and
--                                            looks its row up alongside
-- When the batch filled up (or the skip cap was hit) and work remains in a queue, one wake-up
-- token is left on that queue's wake list for another worker.
local now, lease_ms = shard_now(ARGV[1]), tonumber(ARGV[2])
local max_jobs, worker = tonumber(ARGV[3]), ARGV[4]
local deadline = now + lease_ms
local now_s, deadline_s = int_s(now), int_s(deadline)
local out = {}
local claimed = 0
-- Ring entries and job IDs passed over on the way (cancelled IDs, paused or parked tenants,
-- jobs this worker must avoid); capped so one call stays short.
local skipped, MAX_SKIP = 0, 1000

-- Which of the pause and park sets exist (hold anyone): one EXISTS in the usual case of none.
local any_paused, any_tqpaused, any_qpaused = false, false, false
any_parked = false
if redis.call('EXISTS', k_paused(), k_tqpaused(), k_qpaused(), k_parked()) > 0 then
  any_paused = redis.call('EXISTS', k_paused()) == 1
  any_tqpaused = redis.call('EXISTS', k_tqpaused()) == 1
  any_qpaused = redis.call('EXISTS', k_qpaused()) == 1
  any_parked = redis.call('EXISTS', k_parked()) == 1
end

-- Per tenant met in this call: {w = weight, cap = max_active, active, paused, parked}.
local tenants = {}
local function tenant_of(t)
  local i = tenants[t]
  if i then return i end
  local l = redis.call('HMGET', k_limits(t), 'weight', 'max_active')
  i = {w = math.max(1, tonumber(l[1]) or 1), cap = tonumber(l[2]) or 0, active = 0,
       paused = any_paused and redis.call('SISMEMBER', k_paused(), t) == 1,
       parked = any_parked and redis.call('SISMEMBER', k_parked(), t) == 1}
  if i.cap > 0 then i.active = tonumber(redis.call('HGET', k_counts(t), 'active') or '0') or 0 end
  tenants[t] = i
  return i
end

local function park(t, i)
  redis.call('SADD', k_parked(), t)
  i.parked = true
end

-- Whether the tenant may not be served in queue q now (parks it if it is at its cap).
local function blocked(t, i, q)
  if i.paused or i.parked then return true end
  if i.cap > 0 and i.active >= i.cap then
    park(t, i)
    return true
  end
  return any_tqpaused and redis.call('SISMEMBER', k_tqpaused(), t .. '/' .. q) == 1
end

-- The ring's head tenant leaves it (nothing to serve, or not to be served now).
local function drop_head(q, t)
  redis.call('LPOP', k_ring(q))
  redis.call('SREM', k_inring(q), t)
  redis.call('HDEL', k_credit(q), t)
end

-- The head tenant's turn ends: it goes to the ring's end (and its credit, if it may have
-- one, goes).
local function end_turn(q, t, credit)
  if credit then redis.call('HDEL', k_credit(q), t) end
  redis.call('LMOVE', k_ring(q), k_ring(q), 'LEFT', 'RIGHT')
end

-- After serving the head tenant once: drop it when it has no ready job left in q, else
-- rotate it after w jobs.
local function advance(q, t, remaining, w)
  if not remaining then
    drop_head(q, t)
  elseif w <= 1 then
    end_turn(q, t, false)
  elseif redis.call('HINCRBY', k_credit(q), t, 1) >= w then
    end_turn(q, t, true)
  end
end

-- Per queue, per tenant met: its highest priority with a ready job in the queue. Only this
-- call changes it meanwhile: it is read again once that priority's list is emptied.
local tops = {}
local function top_priority(q, t, tprio)
  local top = tops[q][t]
  if not top then
    top = redis.call('ZREVRANGE', tprio, 0, 0)[1]
    tops[q][t] = top
  end
  return top
end

-- Job IDs this worker must avoid met in this call; per queue, tenants whose highest priority
-- holds only such jobs (and how many): they are passed over for the rest of the call.
local avoided, stuck, n_stuck = {}, {}, {}

-- The fencing counter: INCR at the first claim (a call of one job, the usual one at idle,
-- writes it with that one command), counted on here and written back once at the end when the
-- call claimed more than one job.
local fence, first_fence = nil, nil
-- Per tenant: jobs claimed in this call (its 'ready' and 'active' gauges change once, at the end).
local taken = {}
-- The claimed jobs' entries of the lease ZSET (deadline, ID, ...) and, per tenant, of its
-- active set (now, ID, ...), added at the end with one ZADD each: two ZADDs per job were 4% of
-- the server's instructions per claimed job (bench/script_instructions.py).
local leased, activated = {}, {}

local function take(q, t, i, id, j)
  local job = k_job(id)
  if fence then
    fence = fence + 1
  else
    fence = redis.call('INCR', KEYS[2])
    first_fence = fence
  end
  local attempts = (tonumber(j[12]) or 0) + 1
  -- Read before this claim sets 'f': a job never claimed before has 'f' = 0 (enqueue.lua).
  local at_once = (j[15] ~= 'd' and tonumber(j[14] or '0') == 0) and '1' or '0'
  -- A job promoted ahead (promote.lua's ahead_ms) starts on its run-at: its worker waits.
  local starts = math.max(now, tonumber(j[8]) or 0)
  local starts_s = now_s
  if starts > now then starts_s = int_s(starts) end
  redis.call('HSET', job, 's', 'active', 'f', int_s(fence), 'w', worker, 'sa', starts_s,
    'at', int_s(attempts))
  if j[2] then redis.call('HDEL', job, 'xw', 'xu') end
  leased[#leased + 1], leased[#leased + 2] = deadline_s, id
  local active = table_at(activated, t)
  active[#active + 1], active[#active + 2] = now_s, id
  taken[t] = (taken[t] or 0) + 1
  if i.cap > 0 then
    i.active = i.active + 1
    if i.active >= i.cap then park(t, i) end
  end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, fence, t, j[4]
  out[n + 5], out[n + 6], out[n + 7], out[n + 8] = j[5], j[6], j[7] or '0', j[8]
  out[n + 9], out[n + 10] = j[9], attempts
  out[n + 11], out[n + 12] = j[10] or UNSTORED_MAX_ATTEMPTS, j[11] or UNSTORED_TIMEOUT_MS
  out[n + 13], out[n + 14], out[n + 15], out[n + 16] = q, now, j[13] or '', at_once
  claimed = claimed + 1
end

-- Claim one job from queue q; false when q has nothing more for this call.
local function claim_from(q)
  local ring = k_ring(q)
  while skipped < MAX_SKIP do
    local t = redis.call('LINDEX', ring, 0)
    if not t then return false end
    local i = tenant_of(t)
    if blocked(t, i, q) then
      drop_head(q, t)
      skipped = skipped + 1
    elseif stuck[q][t] then
      if n_stuck[q] >= redis.call('LLEN', ring) then return false end
      end_turn(q, t, true)
      skipped = skipped + 1
    else
      local tprio = k_tprio(t, q)
      local prio = top_priority(q, t, tprio)
      local rkey = prio and k_ready(t, q, prio)
      local id = prio and redis.call('LPOP', rkey)
      if not id then
        -- No ready job in q after all: off the ring (and any stale priority with it).
        if prio then redis.call('ZREM', tprio, prio) end
        tops[q][t] = nil
        if redis.call('ZCARD', tprio) == 0 then
          redis.call('SREM', k_tqueues(t), q)
          drop_head(q, t)
        end
        skipped = skipped + 1
      else
        local remaining = true
        if redis.call('LLEN', rkey) == 0 then
          tops[q][t] = nil
          redis.call('ZREM', tprio, prio)
          if redis.call('ZCARD', tprio) == 0 then
            redis.call('SREM', k_tqueues(t), q)
            remaining = false
          end
        end
        local j = redis.call('HMGET', k_job(id), 's', 'xw', 'xu', 'r', 'h', 'p', 'pr', 'ra', 'ca',
          'ma', 'to', 'at', 'tc', 'f', 'ck')
        if j[1] == 'ready' and j[2] == worker and (tonumber(j[3]) or 0) > now then
          -- Handed back by this worker, which lacks its handler: to the tail, for another.
          if redis.call('RPUSH', rkey, id) == 1 then
            redis.call('ZADD', tprio, prio, prio)
            redis.call('SADD', k_tqueues(t), q)
          end
          if avoided[id] and not stuck[q][t] then
            stuck[q][t] = true
            n_stuck[q] = n_stuck[q] + 1
          end
          avoided[id] = true
          end_turn(q, t, true)
          skipped = skipped + 1
        else
          advance(q, t, remaining, i.w)
          if j[1] == 'ready' then
            take(q, t, i, id, j)
            return true
          end
          skipped = skipped + 1 -- cancelled while ready: removed lazily, here
        end
      end
    end
  end
  return false
end

local queues, served = {}, {}
for k = 5, #ARGV do
  local q = ARGV[k]
  if not (any_qpaused and redis.call('SISMEMBER', k_qpaused(), q) == 1) then
    queues[#queues + 1] = q
    served[#served + 1] = q
    stuck[q], n_stuck[q], tops[q] = {}, 0, {}
  end
end

local at = 1
while claimed < max_jobs and skipped < MAX_SKIP and #queues > 0 do
  if at > #queues then at = 1 end
  if claim_from(queues[at]) then
    at = at + 1
  else
    table.remove(queues, at)
  end
end

if fence ~= first_fence then redis.call('SET', KEYS[2], int_s(fence)) end
if #leased > 0 then chunked('ZADD', KEYS[3], leased) end
for t, active in pairs(activated) do chunked('ZADD', k_tactive(t), active) end
for t, n in pairs(taken) do
  redis.call('HINCRBY', k_counts(t), 'ready', -n)
  redis.call('HINCRBY', k_counts(t), 'active', n)
end

if claimed >= max_jobs or skipped >= MAX_SKIP then
  for _, q in ipairs(served) do
    if redis.call('LLEN', k_ring(q)) > 0 then wake_workers(q) end
  end
end
return out
