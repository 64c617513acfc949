-- Delete from this (source) shard what the target now has: jobs taken by move_out, finished
-- jobs, dedupe keys and set-aside schedules of a moving tenant. Only after move_in succeeded,
-- so a crash between the two leaves a copy on each side, never none; deleting twice is a no-op.
-- KEYS[1]  {prefix}:                 (prefix)  derives job, moving, dedupe, movingsched keys
-- ARGV[1]  tenant
-- ARGV[2]  n_jobs, ARGV[3] n_dedupe, ARGV[4] n_schedules
-- ARGV[5..] job IDs; then (request_id, value) pairs; then schedule IDs
-- A job is deleted only if move_out took it or it has finished (succeeded or cancelled): an
-- active one stays. A dedupe key only if it still holds the value that was copied.
-- Returns  {jobs deleted, dedupe keys deleted, schedules deleted}
local tenant = ARGV[1]
local n_jobs, n_dedupe, n_sched = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local i = 5
local jobs, dedupe, sched = 0, 0, 0
-- The set and the deletes one call each for the batch (per-job calls made a batch of 100
-- block the shard ~6-9 ms); one HMGET per job remains.
if n_jobs > 0 then
  local ids, was_taken = {}, {}
  for k = 1, n_jobs do ids[k] = ARGV[i + k - 1] end
  i = i + n_jobs
  for s = 1, n_jobs, 1000 do
    local part = {unpack(ids, s, math.min(s + 999, n_jobs))}
    for _, member in ipairs(redis.call('SMISMEMBER', k_moving(tenant), unpack(part))) do
      was_taken[#was_taken + 1] = member
    end
  end
  chunked('SREM', k_moving(tenant), ids)
  local gone = {}
  for k, id in ipairs(ids) do
    local job = k_job(id)
    local j = redis.call('HMGET', job, 't', 's')
    if j[1] == tenant and (was_taken[k] == 1 or j[2] == 'succeeded' or j[2] == 'cancelled') then
      gone[#gone + 1] = job
    end
  end
  if #gone > 0 then
    for s = 1, #gone, 1000 do
      jobs = jobs + redis.call('DEL', unpack(gone, s, math.min(s + 999, #gone)))
    end
  end
end
for _ = 1, n_dedupe do
  local key, value = k_dedupe(tenant, ARGV[i]), ARGV[i + 1]
  i = i + 2
  if redis.call('GET', key) == value then dedupe = dedupe + redis.call('DEL', key) end
end
local sids = {}
for k = 1, n_sched do sids[k] = ARGV[i + k - 1] end
sched = chunked('HDEL', k_moving_schedules(tenant), sids)
return {jobs, dedupe, sched}
