-- The scheduled jobs that the shard loop may look up ahead of their run-at (shard/precheck.py):
-- those of the given tenants due in [from, until] by run-at that were never claimed ('f' 0)
-- and are not yet marked ('ck' absent). Read only; prechecked.lua marks the ones found
-- with a final row. The caller passes the tenants on `due` by `until` (the others have no
-- job due by then) a page at a time; a cursor of (tenants done, offset in the next) walks a
-- tenant with more jobs in the range than one call's limit.
-- KEYS[1]  {prefix}:                 (prefix)  derives job and tscheduled keys
-- ARGV[1]  from_ms                   (int)     lowest run-at read (inclusive), unix ms
-- ARGV[2]  until_ms                  (int)     highest run-at read (inclusive), unix ms
-- ARGV[3]  limit                     (int)     most ZSET entries read in this call
-- ARGV[4]  offset                    (int)     entries of the first tenant's range to pass
--                                              over first (read by the call before)
-- ARGV[5..] tenant                   (string)  whose delayed ZSETs to read, in this order
-- Returns  {tenants_done, offset, id, tenant, request_id, ...}: how many of the tenants
--          passed were read to the end of their range (the next call starts with the one
--          after them) and the offset to pass in that next tenant's range; then 3 entries per
--          job to look up
local from, upto, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local offset = tonumber(ARGV[4])
local out = {0, 0}
local read = 0
for n = 5, #ARGV do
  local tenant, want = ARGV[n], limit - read
  local ids = redis.call('ZRANGE', k_tscheduled(tenant), from, upto, 'BYSCORE', 'LIMIT', offset,
    want)
  read = read + #ids
  for _, id in ipairs(ids) do
    local j = redis.call('HMGET', k_job(id), 's', 'f', 'ck', 'r')
    if j[1] == 'scheduled' and tonumber(j[2] or '0') == 0 and not j[3] then
      out[#out + 1], out[#out + 2], out[#out + 3] = id, tenant, j[4]
    end
  end
  if #ids < want then
    out[1], offset = out[1] + 1, 0
  else
    offset = offset + #ids
    break
  end
end
out[2] = offset
return out
