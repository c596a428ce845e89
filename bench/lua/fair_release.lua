-- Redisson fair lock release (RedissonFairLock.unlockInnerAsync).
-- Publishes the unlock message only on the channel of the waiter at the head of
-- the queue (<channel>:<owner>), so one waiter wakes per release.
-- KEYS[1] lock key; KEYS[2] queue; KEYS[3] timeouts; KEYS[4] channel prefix;
-- ARGV[1] unlock message; ARGV[2] lease ms; ARGV[3] owner; ARGV[4] client's now (unix ms).
-- Returns nil (not the owner), 0 (still held) or 1 (released).
while true do
  local first = redis.call('lindex', KEYS[2], 0)
  if first == false then
    break
  end
  local timeout = tonumber(redis.call('zscore', KEYS[3], first))
  if timeout <= tonumber(ARGV[4]) then
    redis.call('zrem', KEYS[3], first)
    redis.call('lpop', KEYS[2])
  else
    break
  end
end
if redis.call('exists', KEYS[1]) == 0 then
  local next_owner = redis.call('lindex', KEYS[2], 0)
  if next_owner ~= false then
    redis.call('publish', KEYS[4] .. ':' .. next_owner, ARGV[1])
  end
  return 1
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
  return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if counter > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
local next_owner = redis.call('lindex', KEYS[2], 0)
if next_owner ~= false then
  redis.call('publish', KEYS[4] .. ':' .. next_owner, ARGV[1])
end
return 1
