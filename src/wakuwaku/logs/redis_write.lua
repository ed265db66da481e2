-- Append records and store offsets for the Redis log, fenced, all or nothing
-- (RedisLog.append, .commit and .store; docs/logs.md "The Redis log").
--
-- Every check runs before the first write, so a refused call writes nothing;
-- a script runs alone on its Redis node, so no other client sees half of it.
--
-- KEYS[1..F]        lease hash of each fence ({tag}:lease; field = group)
-- KEYS[F+1]         idempotency token key ({tag}:tok:<token>), or any key
-- then per append   partition meta hash ({tag}:meta), stream ({tag}:s)
-- then per commit   partition meta hash, offsets hash ({tag}:off; field = group)
--
-- ARGV: F, then F x (group, generation); token ("" = none), token TTL (ms);
-- commit group; A (appends); C (commits); per append: N records, per record
-- P (header pairs), then body, then P x (field, value) with fields ':'..name;
-- per commit: the offset (a decimal string, stored as given).
--
-- Each record is stored as XADD <stream> 0-<offset+1> t <sec.usec> b <body>
-- :<name> <value>...: offsets are dense, and 0-0 is not a valid stream id.
--
-- Returns the first offset of each append, or an error reply:
--   WKFENCED <index>   fence <index> is not its partition's current lease
--   WKGONE <index>     the partition of key pair <index> (appends, then
--                      commits) does not exist (its topic was deleted)
local fences = tonumber(ARGV[1])
local a = 2
for i = 1, fences do
  local held = redis.call('HGET', KEYS[i], ARGV[a])
  local generation = held and string.match(held, '^(%d+):')
  if generation ~= ARGV[a + 1] then
    return redis.error_reply('WKFENCED ' .. i)
  end
  a = a + 2
end
local token, token_ttl, group = ARGV[a], ARGV[a + 1], ARGV[a + 2]
local appends, commits = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
a = a + 5
if token ~= '' then
  local done = redis.call('GET', KEYS[fences + 1])
  if done then
    -- (first offset, record count) of each append the token's first run wrote
    local firsts = {}
    for n in string.gmatch(done, '%d+') do firsts[#firsts + 1] = tonumber(n) end
    return firsts
  end
end
local k = fences + 2
for i = 1, appends + commits do
  if redis.call('EXISTS', KEYS[k]) == 0 then
    return redis.error_reply('WKGONE ' .. i)
  end
  k = k + 2
end
local now = redis.call('TIME')
local stamp = now[1] .. '.' .. string.format('%06d', tonumber(now[2]))
local firsts = {}
k = fences + 2
for i = 1, appends do
  local meta, stream = KEYS[k], KEYS[k + 1]
  local first = tonumber(redis.call('HGET', meta, 'next'))
  local offset = first
  local count = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, count do
    local pairs_count = tonumber(ARGV[a])
    local entry = {'XADD', stream, string.format('0-%d', offset + 1), 't', stamp, 'b', ARGV[a + 1]}
    a = a + 2
    for _ = 1, pairs_count do
      entry[#entry + 1] = ARGV[a]
      entry[#entry + 1] = ARGV[a + 1]
      a = a + 2
    end
    redis.call(unpack(entry))
    offset = offset + 1
  end
  if count > 0 then
    redis.call('HSET', meta, 'next', string.format('%d', offset))
  end
  firsts[2 * i - 1] = first
  firsts[2 * i] = count
  k = k + 2
end
for _ = 1, commits do
  redis.call('HSET', KEYS[k + 1], group, ARGV[a])
  a = a + 1
  k = k + 2
end
if token ~= '' then
  local done = {}
  for i = 1, #firsts do done[i] = string.format('%d', firsts[i]) end
  redis.call('SET', KEYS[fences + 1], table.concat(done, ','), 'PX', token_ttl)
end
return firsts
