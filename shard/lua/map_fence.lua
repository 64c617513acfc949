-- Raise (or take back) the lowest shard-map version whose submits this shard accepts.
-- Raised on a move's source shard while the move is being committed: from then on, enqueue
-- refuses a submit routed with an older map (STALE_MAP), so no coordinator that has not seen
-- the move can still add work here. Never lowered below a later raise.
-- KEYS[1]  {prefix}:                 (prefix)  derives the mapfence key
-- ARGV[1]  version                   (int)
-- ARGV[2]  'raise' (to at least version) | 'undo' (back to version - 1 if still at version)
-- Returns  the fence after the call
local v, mode = tonumber(ARGV[1]), ARGV[2]
local cur = tonumber(redis.call('GET', k_map_fence()) or '0')
if mode == 'raise' and cur < v then
  redis.call('SET', k_map_fence(), v)
  return v
elseif mode == 'undo' and cur == v then
  redis.call('SET', k_map_fence(), v - 1)
  return v - 1
end
return cur
