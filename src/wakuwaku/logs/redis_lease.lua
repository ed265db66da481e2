-- Take, renew or release a partition lease of the Redis log (design §15).
--
-- KEYS[1]  the partition's lease hash ({tag}:lease); field = group, value
--          '<generation>:<expires, ms since the epoch>:<member>'
-- ARGV[1]  'acquire' or 'release'
-- ARGV[2]  group
-- ARGV[3]  member (acquire) or generation (release)
-- ARGV[4]  time to live, ms (acquire)
--
-- Expiry is judged by the server's clock (TIME), the one clock every client
-- shares. The generation only grows: it stays in the hash when a lease is
-- released or expires, and a member that takes the partition from another
-- member (or from nobody) gets the next one.
--
-- acquire returns {generation, expires_ms}, or {} when another member's
-- lease is alive; release returns 1 when it released, 0 when the lease had
-- moved on.
local held = redis.call('HGET', KEYS[1], ARGV[2])
local generation, expires, member = 0, 0, ''
if held then
  local g, e, m = string.match(held, '^(%d+):(%d+):(.*)$')
  generation, expires, member = tonumber(g), tonumber(e), m
end
if ARGV[1] == 'release' then
  if held and string.format('%d', generation) == ARGV[3] then
    redis.call('HSET', KEYS[1], ARGV[2], string.format('%d:0:', generation))
    return 1
  end
  return 0
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if member ~= ARGV[3] then
  if member ~= '' and expires > now_ms then
    return {}
  end
  generation = generation + 1
end
expires = now_ms + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], ARGV[2], string.format('%d:%d:', generation, expires) .. ARGV[3])
return {generation, expires}
