-- Take or keep the shard loop's leader lease: granted when free or already ours.
-- KEYS[1]  {prefix}:                    (prefix)
-- KEYS[2]  {prefix}:leader              (STRING) instance ID of the leader, with a TTL
-- ARGV[1]  instance_id                  (string)
-- ARGV[2]  ttl_ms                       (int)    lease length from now
-- Returns  1 when the caller holds the lease now, 0 when another instance does
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
