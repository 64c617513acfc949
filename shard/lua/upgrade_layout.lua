-- Convert what the previous layout still holds into queue 'default', at most `limit` jobs
-- per call (the caller calls again until done): each tenant's ready:{t}:{p} list moves to the
-- head of ready:{t}:default:{p} (its jobs were submitted before any the new list holds, so
-- FIFO is kept), the tenant joins tprio, tqueues and the ring of 'default'; emptied old rings
-- ring:{p} and credit:{p} go; the weights HASH becomes limits:{t} 'weight' (a weight already
-- set there stays); the old wake list goes. Idempotent: on a converted shard it reads ten
-- empty rings and one absent hash. Jobs stay ready throughout (counts:{t} already counts them).
-- KEYS[1]  {prefix}:                 (prefix)  derives ring:{p}, credit:{p}, ready:{t}:{p},
--                                              weights, wake (the previous layout) and ready,
--                                              tprio, tqueues, qring, inring, limits, wake keys
-- ARGV[1]  limit                     (int)     most jobs (and weights) to convert in this call
-- Returns  {jobs moved, 1 when nothing of the previous layout is left | 0}
local limit = tonumber(ARGV[1])
local moved = 0
local q = DEFAULT_QUEUE

for prio = 9, 0, -1 do
  local ring = k_old_ring(prio)
  while moved < limit do
    local t = redis.call('LINDEX', ring, 0)
    if not t then break end
    local old = k_old_ready(t, prio)
    local ids = redis.call('LRANGE', old, -(limit - moved), -1)
    if #ids > 0 then
      local reversed = {}
      for n = #ids, 1, -1 do reversed[#reversed + 1] = ids[n] end
      redis.call('LPUSH', k_ready(t, q, prio), unpack(reversed))
      redis.call('LTRIM', old, 0, -(#ids + 1))
      redis.call('ZADD', k_tprio(t, q), prio, prio)
      redis.call('SADD', k_tqueues(t), q)
      ring_tenant(t, q)
      to_wake[q] = true
      moved = moved + #ids
    end
    if redis.call('LLEN', old) == 0 then
      redis.call('LPOP', ring)
      redis.call('HDEL', k_old_credit(prio), t)
    end
  end
  if moved >= limit then
    settle()
    return {moved, 0}
  end
  redis.call('DEL', k_old_credit(prio))
end

-- One pass of HSCAN at most (fields are deleted as they are read: the next call starts over).
local weights, cursor, converted = k_old_weights(), '0', 0
repeat
  local page = redis.call('HSCAN', weights, cursor, 'COUNT', 100)
  cursor = page[1]
  for n = 1, #page[2], 2 do
    local t, w = page[2][n], page[2][n + 1]
    if (tonumber(w) or 1) > 1 then redis.call('HSETNX', k_limits(t), 'weight', w) end
    redis.call('HDEL', weights, t)
    converted = converted + 1
  end
until cursor == '0' or converted >= limit
settle()
if redis.call('EXISTS', weights) == 1 then return {moved, 0} end
redis.call('DEL', k_old_wake())
return {moved, 1}
