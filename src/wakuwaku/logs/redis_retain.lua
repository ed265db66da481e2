-- Retention of one partition of the Redis log: delete the records below
-- every group's committed offset (never past the end).
--
-- KEYS[1]  partition meta hash ({tag}:meta: next, start)
-- KEYS[2]  offsets hash ({tag}:off: group -> committed offset)
-- KEYS[3]  stream ({tag}:s)
--
-- Returns how many records were deleted.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local offsets = redis.call('HVALS', KEYS[2])
if #offsets == 0 then
  return 0
end
local low = tonumber(redis.call('HGET', KEYS[1], 'next'))
for _, offset in ipairs(offsets) do
  local value = tonumber(offset)
  if value < low then low = value end
end
local start = tonumber(redis.call('HGET', KEYS[1], 'start'))
if low <= start then
  return 0
end
local removed = redis.call('XTRIM', KEYS[3], 'MINID', string.format('0-%d', low + 1))
redis.call('HSET', KEYS[1], 'start', string.format('%d', low))
return removed
