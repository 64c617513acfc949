-- Add a moving tenant's jobs, dedupe keys and recurring schedules to this (target) shard, each
-- exactly as it was on the source: state, queue, priority, run-at, attempts and fencing
-- token (a ready job joins its tenant's list, priorities and ring of its queue). A job
-- already here (or whose dedupe key says it was) is skipped, so a re-run mover adds nothing
-- twice. The shard's fencing counter is raised past every imported token, so a later claim
-- here always takes a higher one.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, scheduled, tscheduled, ready,
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

for _ = 1, n_jobs do
  local id, pttl, nf = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local first, last = i + 3, i + 2 + 2 * nf
  i = last + 1
  local f = {}
  for j = first, last, 2 do f[ARGV[j]] = ARGV[j + 1] end
  local seen = f['r'] and redis.call('GET', k_dedupe(tenant, f['r']))
  local here_before = seen and string.match(seen, '^(%S+) ') == id
  if f['t'] == tenant and redis.call('EXISTS', k_job(id)) == 0 and not here_before then
    local job = k_job(id)
    for j = first, last, 2 do redis.call('HSET', job, ARGV[j], ARGV[j + 1]) end
    local state = f['s']
    if state == 'scheduled' then
      push_scheduled(id, tenant, tonumber(f['ra']))
      redis.call('HINCRBY', k_counts(tenant), 'scheduled', 1)
    elseif state == 'ready' then
      push_ready(id, tenant, f['q'] or DEFAULT_QUEUE, f['pr'])
      redis.call('HINCRBY', k_counts(tenant), 'ready', 1)
    elseif state == 'dead' then
      push_dead(id, tenant, tonumber(f['fa']) or now)
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
