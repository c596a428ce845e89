-- Redisson RLock release (RedissonLock.unlockInnerAsync, 3.13 line).
-- Decrements the owner's hold count; at zero deletes the lock and publishes
-- the unlock message on the lock's channel, which every subscribed waiter receives.
-- KEYS[1] lock key; KEYS[2] channel (redisson_lock__channel:{key});
-- ARGV[1] unlock message; ARGV[2] lease ms; ARGV[3] owner.
-- Returns nil (not the owner), 0 (still held) or 1 (released).
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if counter > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
