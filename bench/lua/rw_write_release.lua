-- Redisson write lock release (RedissonWriteLock.unlockInnerAsync).
-- KEYS[1] lock key; KEYS[2] channel (redisson_rwlock:{key});
-- ARGV[1] unlock message; ARGV[2] lease ms; ARGV[3] owner's write-lock name.
-- Returns nil (not the writer), 0 (still held) or 1 (released).
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
if mode == 'write' then
  local lock_exists = redis.call('hexists', KEYS[1], ARGV[3])
  if lock_exists == 0 then
    return nil
  end
  local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
  if counter > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
  end
  redis.call('hdel', KEYS[1], ARGV[3])
  if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[2], ARGV[1])
  else
    -- read holds remain: downgrade to read mode
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  return 1
end
return nil
