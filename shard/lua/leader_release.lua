-- Give up the leader lease at shutdown so a standby takes over at once, only if still ours.
-- KEYS[1]  {prefix}:                    (prefix)
-- KEYS[2]  {prefix}:leader              (STRING) instance ID of the leader, with a TTL
-- ARGV[1]  instance_id                  (string)
-- Returns  1 when released, 0 when the lease was not ours
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
return 1
