-- Store a job result and nudge its waiters, atomically and in one round trip
-- (design §10). Used by wakuwaku.reliability.waiter.publish_result.
--
-- KEYS[1]  result key      wk:result:<job_id>:<step>
-- ARGV[1]  payload         JSON object {"status": "done"|"error", ...}
-- ARGV[2]  time to live    milliseconds (integer > 0)
-- ARGV[3]  nudge channel   wk:nudge:<job_id>:<step>
-- ARGV[4]  nudge message   the status (waiters ignore it and read the key)
--
-- Returns the number of subscribers that received the nudge.
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('PUBLISH', ARGV[3], ARGV[4])
