-- Add a moving tenant's jobs, dedupe keys and recurring schedules to this (target) shard, each
-- exactly as it was on the source: state, queue, priority, run-at, attempts and fencing
-- token (a ready job joins its tenant's list, priorities and ring of its queue). A scheduled
-- job whose run-at has come (by the shard's clock, ARGV[2]) arrives ready, as the shard loop
-- would have promoted it: a job due while the mover had it set aside starts without waiting
-- for the loop. A later one joins its tenant's delayed ZSET (the tenant on `due`), the loop
-- woken if it is the earliest. A job already here (or whose dedupe key says it was) is
-- skipped, so a re-run mover adds nothing twice. The shard's fencing counter is raised past
-- every imported token, so a later claim here always takes a higher one.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, due, tscheduled, ready,
--                                              tprio, tqueues, qring, inring, dead, dedupe,
--                                              counts, tenants, fence, wake, promoter_wake,
--                                              schedules, cron keys
-- ARGV[1]  tenant
-- ARGV[2]  now_ms                    (int)     0: the shard's clock (Redis TIME); else this
--                                              value, unix ms (a dead job's score if no 'fa')
-- ARGV[3]  n_jobs, ARGV[4] n_dedupe, ARGV[5] n_schedules
-- ARGV[6..] n_jobs records:      job_id, pttl_ms (-1 = none), n_fields, field, value, ...
--                                 (the source's job hash, field by field as stored: 't', 'r',
--                                 's', 'pr', 'q', 'p', 'ra', 'fa', 'f' are read here, the rest
--                                 copied; a scheduled or ready job's payload counts in 'bytes')
--           n_dedupe records:    request_id, value, pttl_ms
--           n_schedules records: schedule_id, spec (JSON), next_tick_ms
-- Returns  {jobs added, dedupe keys added, schedules added}
local tenant, now = ARGV[1], shard_now(ARGV[2])
local n_jobs, n_dedupe, n_sched = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local i = 6
local added_jobs, added_dedupe, added_sched = 0, 0, 0
local top_fence = tonumber(redis.call('GET', k_fence()) or '0')
-- Per job as few calls as can be (the hash in one HSET; counts, the tenant's place on `due`,
-- the promoter's wake-up and the fence once per batch): each call costs microseconds, and a
-- batch of 100 jobs at ~20 calls each blocked the shard for 7-16 ms.
local counted = {scheduled = 0, ready = 0, dead = 0}

for _ = 1, n_jobs do
  local id, pttl, nf = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local from, last = i + 3, i + 2 + 2 * nf
  i = last + 1
  local f = {}
  for j = from, last, 2 do f[ARGV[j]] = ARGV[j + 1] end
  local seen = f['r'] and redis.call('GET', k_dedupe(tenant, f['r']))
  local here_before = seen and string.match(seen, '^(%S+) ') == id
  if f['t'] == tenant and not here_before and redis.call('EXISTS', k_job(id)) == 0 then
    local job = k_job(id)
    redis.call('HSET', job, unpack(ARGV, from, last))
    local state = f['s']
    local run_at = tonumber(f['ra'] or '0') or 0
    if state == 'scheduled' and run_at <= now then
      -- Due already (it came due while the mover had it set aside): ready here at once, as
      -- promote.lua would make it, rather than waiting for this shard's loop to wake.
      redis.call('HSET', job, 's', 'ready')
      state = 'ready'
    end
    if state == 'scheduled' then
      push_scheduled(id, tenant, run_at)
      counted.scheduled = counted.scheduled + 1
    elseif state == 'ready' then
      push_ready(id, tenant, f['q'] or DEFAULT_QUEUE, f['pr'])
      counted.ready = counted.ready + 1
    elseif state == 'dead' then
      redis.call('ZADD', k_dead(tenant), tonumber(f['fa']) or now, id)
      counted.dead = counted.dead + 1
    end
    if state == 'scheduled' or state == 'ready' then
      add_bytes(tenant, #(f['p'] or ''))
    end
    if pttl > 0 then redis.call('PEXPIRE', job, pttl) end
    local fence = tonumber(f['f']) or 0
    if fence > top_fence then top_fence = fence end
    added_jobs = added_jobs + 1
  end
end
for state, n in pairs(counted) do
  if n > 0 then redis.call('HINCRBY', k_counts(tenant), state, n) end
end
if top_fence > tonumber(redis.call('GET', k_fence()) or '0') then
  redis.call('SET', k_fence(), top_fence)
end

for _ = 1, n_dedupe do
  local rid, value, pttl = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  if pttl > 0 and redis.call('SET', k_dedupe(tenant, rid), value, 'PX', pttl, 'NX') then
    added_dedupe = added_dedupe + 1
  end
end

for _ = 1, n_sched do
  local sid, spec, tick = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  -- A schedule created here during the move is newer than the source's copy: it stays.
  if redis.call('HSETNX', k_schedules(tenant), sid, spec) == 1 then
    wake_promoter_if_first(k_cron(), tick)
    redis.call('ZADD', k_cron(), tick, tenant .. '/' .. sid)
    added_sched = added_sched + 1
  end
end

if added_jobs + added_dedupe + added_sched > 0 then redis.call('SADD', k_tenants(), tenant) end
settle()
return {added_jobs, added_dedupe, added_sched}
