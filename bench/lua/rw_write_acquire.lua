-- Redisson write lock acquire (RedissonWriteLock.tryLockInnerAsync).
-- KEYS[1] lock key; ARGV[1] lease ms; ARGV[2] owner's write-lock name (<owner>:write).
-- Returns nil when granted, else the lock's remaining TTL in ms.
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' then
  if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    local current = redis.call('pttl', KEYS[1])
    redis.call('pexpire', KEYS[1], current + ARGV[1])
    return nil
  end
end
return redis.call('pttl', KEYS[1])
