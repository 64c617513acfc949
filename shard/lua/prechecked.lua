-- Mark jobs the shard loop found no final result row for (shard/precheck.py): 'ck' = 1, which
-- claim.lua answers on the job's first claim so the worker starts it without a lookup. Only a
-- job still never claimed ('f' 0) and not yet run (scheduled or ready) is marked: one claimed
-- since may have run and recorded its row, and its next claim must look the row up.
-- KEYS[1]  {prefix}:                 (prefix)  derives job keys
-- ARGV[1..] job_id                   (string)  jobs whose (tenant, request_id) has no final row
-- Returns  the number marked
local marked = 0
for i = 1, #ARGV do
  local job = k_job(ARGV[i])
  local j = redis.call('HMGET', job, 's', 'f')
  if (j[1] == 'scheduled' or j[1] == 'ready') and tonumber(j[2] or '0') == 0 then
    redis.call('HSET', job, 'ck', '1')
    marked = marked + 1
  end
end
return marked
