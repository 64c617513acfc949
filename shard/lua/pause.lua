-- Pause claims: of a tenant (all its queues), of a queue (for every tenant of the shard), or
-- of one tenant's queue. Submits and promotion go on; running jobs finish. Claim drops a
-- paused tenant from a ring lazily, when it reaches the head.
-- KEYS[1]  {prefix}:                 (prefix)  derives paused, qpaused, tqpaused keys
-- ARGV[1]  tenant                    (string)  '' for none
-- ARGV[2]  queue                     (string)  '' for none (at least one of the two is given)
-- Adds tenant to 'paused', or queue to 'qpaused', or '{tenant}/{queue}' to 'tqpaused'.
-- Returns  1 when it was not paused yet, 0 when it was
local tenant, q = ARGV[1], ARGV[2]
if q == '' then return redis.call('SADD', k_paused(), tenant) end
if tenant == '' then return redis.call('SADD', k_qpaused(), q) end
return redis.call('SADD', k_tqpaused(), tenant .. '/' .. q)
