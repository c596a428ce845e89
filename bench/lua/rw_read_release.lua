-- Redisson read lock release (RedissonReadLock.unlockInnerAsync).
-- Drops one read hold and its timeout key; while other holds remain, the lock's
-- TTL becomes the longest remaining per-hold timeout; when none remain the lock
-- is deleted and the unlock message published.
-- KEYS[1] lock key; KEYS[2] channel (redisson_rwlock:{key});
-- KEYS[3] this owner's timeout-key prefix; KEYS[4] key prefix ({key});
-- ARGV[1] unlock message; ARGV[2] owner.
-- Returns nil (not a holder), 0 (still held) or 1 (released).
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
local lock_exists = redis.call('hexists', KEYS[1], ARGV[2])
if lock_exists == 0 then
  return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if counter == 0 then
  redis.call('hdel', KEYS[1], ARGV[2])
end
redis.call('del', KEYS[3] .. ':' .. (counter + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local max_remain = -3
  local keys = redis.call('hkeys', KEYS[1])
  for _, key in ipairs(keys) do
    counter = tonumber(redis.call('hget', KEYS[1], key))
    if type(counter) == 'number' then
      for i = counter, 1, -1 do
        local remain = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i)
        max_remain = math.max(remain, max_remain)
      end
    end
  end
  if max_remain > 0 then
    redis.call('pexpire', KEYS[1], max_remain)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
