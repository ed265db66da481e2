-- Spend one attempt of a retry budget (design §11, seed 000).
--
-- INCR and PEXPIRE run in one script, so a counter can never exist without a
-- time to live (INCR alone creates an immortal key if the process dies before
-- its EXPIRE). The TTL is set on EVERY spend, not only when the counter is
-- created: it then measures the gap since the latest attempt, which is what
-- "twice the longest possible gap between two attempts" bounds, and a key
-- left without a TTL by any older writer is repaired on its next spend.
--
-- KEYS[1]  counter key     wk:budget:<job_id>:<step>
-- ARGV[1]  time to live    milliseconds (integer > 0)
--
-- Returns the attempt number: 1 on the first spend.
local attempts = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return attempts
