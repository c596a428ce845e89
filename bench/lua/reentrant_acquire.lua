-- Redisson RLock acquire (RedissonLock.tryLockInnerAsync, 3.13 line).
-- The lock is a hash {owner -> hold count} with the lease as the key's TTL.
-- Returns nil when granted, else the lock's remaining TTL in ms (the client
-- waits that long, or for an unlock message, and retries).
-- KEYS[1] lock key; ARGV[1] lease ms; ARGV[2] owner (<uuid>:<thread id>).
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
