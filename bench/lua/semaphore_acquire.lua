-- Redisson permit-expirable semaphore acquire (RedissonPermitExpirableSemaphore.tryAcquireAsync),
-- with trySetPermits folded in so that, like SEMAPHORE.ACQUIRE ... LIMIT n, one call sets up a
-- semaphore that does not exist yet. The semaphore is a counter of available permits; each
-- permit taken is a member of a zset scored by its expiry, and expired permits are returned to
-- the counter (and announced) by the next acquisition.
-- KEYS[1] available-permits counter; KEYS[2] timeout zset (redisson__timeout__set:{name});
-- KEYS[3] channel (redisson_sc:{name});
-- ARGV[1] permits; ARGV[2] permit id; ARGV[3] expiry (unix ms); ARGV[4] now (unix ms);
-- ARGV[5] permits of a semaphore set up by this call.
-- Returns nil when granted, else ms until the earliest permit expires (-1: none expires).
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[4], 'limit', 0, ARGV[1])
if #expiredIds > 0 then
  redis.call('zrem', KEYS[2], unpack(expiredIds))
  local value = redis.call('incrby', KEYS[1], #expiredIds)
  if tonumber(value) > 0 then
    redis.call('publish', KEYS[3], value)
  end
end
local value = redis.call('get', KEYS[1])
if value == false then
  value = ARGV[5]
  redis.call('set', KEYS[1], value)
end
if tonumber(value) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1])
  redis.call('zadd', KEYS[2], ARGV[3], ARGV[2])
  return nil
end
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if v[1] ~= nil then
  return math.max(0, tonumber(v[2]) - tonumber(ARGV[4]))
end
return -1
