-- Add a moved tenant's counters (submitted, succeeded, failed, unrunnable) from the source to
-- this (target) shard, once per move: the marker key set here in the same step makes a re-run
-- add nothing. Gauges (with 'bytes') are not added: they follow the jobs, which move_in counted.
-- KEYS[1]  {prefix}:                 (prefix)  derives counts
-- KEYS[2]  {prefix}:movedin:{tenant}:{move_id}  (STRING)  the once-per-move marker
-- KEYS[3]  {prefix}:load              (HASH)    the shard loop's load samples (shard.load): the
--                                              tenant's becomes the source's last sample, its
--                                              rates carried and its counters set to the sums
--                                              here, so planning sees the tenant's load from
--                                              the start and the next rate counts only what
--                                              came after; dropped when the source had none
--                                              (or its next rate would count the whole history
--                                              added here as one interval's work)
-- ARGV[1]  tenant, ARGV[2] marker TTL ms
-- ARGV[3]  the source's load sample of the tenant (JSON, shard.load), '' for none
-- ARGV[4..] pairs: counter name, value
-- Returns  1 if added now, 0 if this move's counters were added before
local tenant, ttl, sample = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if not redis.call('SET', KEYS[2], '1', 'PX', ttl, 'NX') then return 0 end
for j = 4, #ARGV, 2 do
  redis.call('HINCRBY', k_counts(tenant), ARGV[j], ARGV[j + 1])
end
local ok, carried = pcall(cjson.decode, sample)
if sample ~= '' and ok and type(carried) == 'table' then
  for _, counter in ipairs({'submitted', 'succeeded', 'failed'}) do
    carried[counter] = tonumber(redis.call('HGET', k_counts(tenant), counter) or '0')
  end
  redis.call('HSET', KEYS[3], tenant, cjson.encode(carried))
else
  redis.call('HDEL', KEYS[3], tenant)
end
return 1
