-- Shared helpers, prepended to every script of this folder when it is registered (see
-- shard/scripts.py). KEYS[1] is always the key prefix plus ':' (Keys.base()); per-tenant keys
-- that a script only discovers while it runs are derived from it here, spelled exactly as in
-- shard/keys.py (tests/unit/test_keys.py checks that both agree).
local base = KEYS[1]
local function k_job(id) return base .. 'job:' .. id end
local function k_scheduled() return base .. 'scheduled' end
local function k_tscheduled(t) return base .. 'tscheduled:' .. t end
local function k_tactive(t) return base .. 'tactive:' .. t end
local function k_ready(t, prio) return base .. 'ready:' .. t .. ':' .. prio end
local function k_ring(prio) return base .. 'ring:' .. prio end
local function k_credit(prio) return base .. 'credit:' .. prio end
local function k_weights() return base .. 'weights' end
local function k_leases() return base .. 'leases' end
local function k_fence() return base .. 'fence' end
local function k_dead(t) return base .. 'dead:' .. t end
local function k_dedupe(t, rid) return base .. 'dedupe:' .. t .. ':' .. rid end
local function k_counts(t) return base .. 'counts:' .. t end
local function k_tenants() return base .. 'tenants' end
local function k_bucket(t) return base .. 'bucket:' .. t end
local function k_wake() return base .. 'wake' end
local function k_promoter_wake() return base .. 'promoter_wake' end
local function k_schedules(t) return base .. 'schedules:' .. t end
local function k_cron() return base .. 'cron' end
local function k_map_fence() return base .. 'mapfence' end
local function k_moving(t) return base .. 'moving:' .. t end
local function k_moving_schedules(t) return base .. 'movingsched:' .. t end
local function k_moved_counts(t) return base .. 'movedcounts:' .. t end

-- Most wake-up tokens kept for idle workers; more would only cause empty claims.
local WAKE_CAP = 64

-- Append a job to its tenant's ready list; a list that was empty puts the tenant on the ring.
local function push_ready(id, tenant, prio)
  if redis.call('RPUSH', k_ready(tenant, prio), id) == 1 then
    redis.call('RPUSH', k_ring(prio), tenant)
  end
end

local function wake_workers()
  redis.call('LPUSH', k_wake(), '1')
  redis.call('LTRIM', k_wake(), 0, WAKE_CAP - 1)
end

-- Wake the shard loop when `at` comes before everything in `zset` (it sleeps until then).
local function wake_promoter_if_first(zset, at)
  local first = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
  if first[2] == nil or at < tonumber(first[2]) then
    redis.call('LPUSH', k_promoter_wake(), '1')
    redis.call('LTRIM', k_promoter_wake(), 0, 0)
  end
end

-- Put a job on the delayed ZSETs; wake the shard loop if it is now the earliest job.
local function push_scheduled(id, tenant, run_at)
  wake_promoter_if_first(k_scheduled(), run_at)
  redis.call('ZADD', k_scheduled(), run_at, id)
  redis.call('ZADD', k_tscheduled(tenant), run_at, id)
end

local function push_dead(id, tenant, now)
  redis.call('ZADD', k_dead(tenant), now, id)
  redis.call('HINCRBY', k_counts(tenant), 'dead', 1)
end

-- Ends an active job's lease: off the lease ZSETs, one fewer active.
local function end_lease(id, tenant)
  redis.call('ZREM', k_leases(), id)
  redis.call('ZREM', k_tactive(tenant), id)
  redis.call('HINCRBY', k_counts(tenant), 'active', -1)
end

-- Codes shared with shard/codes.py (ItemCode).
local OK, DEDUPLICATED, CONFLICT, OVER_QUOTA, RATE_LIMITED = 0, 1, 2, 3, 4
local STALE_LEASE, CANCEL_REQUESTED, NOT_FOUND, ALREADY_TERMINAL, CANCELLED = 5, 6, 7, 8, 9
local STALE_MAP, MOVING = 10, 11
