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
for _ = 1, n_jobs do
  local id = ARGV[i]
  i = i + 1
  local job = k_job(id)
  local taken = redis.call('SREM', k_moving(tenant), id) == 1
  local j = redis.call('HMGET', job, 't', 's')
  if j[1] == tenant and (taken or j[2] == 'succeeded' or j[2] == 'cancelled') then
    jobs = jobs + redis.call('DEL', job)
  end
end
for _ = 1, n_dedupe do
  local key, value = k_dedupe(tenant, ARGV[i]), ARGV[i + 1]
  i = i + 2
  if redis.call('GET', key) == value then dedupe = dedupe + redis.call('DEL', key) end
end
for _ = 1, n_sched do
  sched = sched + redis.call('HDEL', k_moving_schedules(tenant), ARGV[i])
  i = i + 1
end
return {jobs, dedupe, sched}
