-- Add a moved tenant's counters (submitted, succeeded, failed, unrunnable) from the source to
-- this (target) shard, once per move: the marker key set here in the same step makes a re-run
-- add nothing. Gauges (with 'bytes') are not added: they follow the jobs, which move_in counted.
-- KEYS[1]  {prefix}:                 (prefix)  derives counts
-- KEYS[2]  {prefix}:movedin:{tenant}:{move_id}  (STRING)  the once-per-move marker
-- KEYS[3]  {prefix}:load              (HASH)    the shard loop's load samples: the tenant's is
--                                              dropped, or its next rate would count the whole
--                                              history added here as one interval's work
-- ARGV[1]  tenant, ARGV[2] marker TTL ms
-- ARGV[3..] pairs: counter name, value
-- Returns  1 if added now, 0 if this move's counters were added before
local tenant, ttl = ARGV[1], tonumber(ARGV[2])
if not redis.call('SET', KEYS[2], '1', 'PX', ttl, 'NX') then return 0 end
redis.call('HDEL', KEYS[3], tenant)
for j = 3, #ARGV, 2 do
  redis.call('HINCRBY', k_counts(tenant), ARGV[j], ARGV[j + 1])
end
return 1
