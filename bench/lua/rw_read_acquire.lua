-- Redisson read lock acquire (RedissonReadLock.tryLockInnerAsync).
-- The lock is a hash with a 'mode' field ('read'/'write') and {owner -> holds};
-- every read hold also gets its own timeout key <prefix>:<n> carrying its lease.
-- KEYS[1] lock key; KEYS[2] this owner's timeout-key prefix ({key}:<owner>:rwlock_timeout);
-- ARGV[1] lease ms; ARGV[2] owner; ARGV[3] owner's write-lock name (<owner>:write).
-- Returns nil when granted, else the lock's remaining TTL in ms.
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local key = KEYS[2] .. ':' .. ind
  redis.call('set', key, 1)
  redis.call('pexpire', key, ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
