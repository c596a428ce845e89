-- Redisson permit-expirable semaphore release (RedissonPermitExpirableSemaphore.tryReleaseAsync):
-- the permit leaves the timeout zset, the counter gets it back, and every subscriber of the
-- semaphore's channel is told how many permits are available.
-- KEYS[1] available-permits counter; KEYS[2] channel (redisson_sc:{name});
-- KEYS[3] timeout zset (redisson__timeout__set:{name});
-- ARGV[1] permits; ARGV[2] permit id; ARGV[3] now (unix ms).
-- Returns 1 when the permit was released, 0 when it was not held (or had expired).
local expire = redis.call('zscore', KEYS[3], ARGV[2])
local removed = redis.call('zrem', KEYS[3], ARGV[2])
if tonumber(removed) ~= 1 then
  return 0
end
local value = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], value)
if tonumber(expire) <= tonumber(ARGV[3]) then
  return 0
end
return 1
