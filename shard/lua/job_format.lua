-- Raise the job-hash format enqueue.lua writes on this shard (never lower it): `shardq shards
-- finalize`, once every pod runs a release that reads that format (docs/deploying.md,
-- "Upgrading"). A shard without the key is at format 1.
-- KEYS[1]  {prefix}:                 (prefix)  derives the jobformat key
-- ARGV[1]  format                    (int)     0: only read it
-- Returns  {format before, format after}
local want = tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', k_job_format()) or '1')
if want > cur then
  redis.call('SET', k_job_format(), want)
  return {cur, want}
end
return {cur, cur}
