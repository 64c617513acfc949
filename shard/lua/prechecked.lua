-- Mark jobs the shard loop found a final result row for (shard/precheck.py): 'ck' = 'd', which
-- claim.lua answers on the job's first claim so the worker looks the row up before it starts
-- the job (and acks it unrun), instead of starting it at once. Only a job still never claimed
-- ('f' 0) and not yet run (scheduled or ready) is marked: a claim looks a claimed job up first
-- anyway.
-- KEYS[1]  {prefix}:                 (prefix)  derives job keys
-- ARGV[1..] job_id                   (string)  jobs whose (tenant, request_id) has a final row
-- Returns  the number marked
local marked = 0
for i = 1, #ARGV do
  local job = k_job(ARGV[i])
  local j = redis.call('HMGET', job, 's', 'f')
  if (j[1] == 'scheduled' or j[1] == 'ready') and tonumber(j[2] or '0') == 0 then
    redis.call('HSET', job, 'ck', 'd')
    marked = marked + 1
  end
end
return marked
