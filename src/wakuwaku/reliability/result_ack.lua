-- Delete a job result only if it is still the payload the caller read
-- (design §10, non-destructive mode). A result written again in the meantime
-- (a re-run of the same job and step) is left for its own waiter.
--
-- KEYS[1]  result key
-- ARGV[1]  the payload exactly as it was read
--
-- Returns 1 when the key was deleted, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
