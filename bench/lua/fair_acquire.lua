-- Redisson fair lock acquire (RedissonFairLock.tryLockInnerAsync, EVAL_LONG).
-- The holder is a hash as in the reentrant lock; waiters are a list (the queue)
-- and a sorted set of their give-up times (the timeouts).
-- KEYS[1] lock key; KEYS[2] queue (redisson_lock_queue:{key});
-- KEYS[3] timeouts (redisson_lock_timeout:{key});
-- ARGV[1] lease ms; ARGV[2] owner; ARGV[3] thread wait time ms; ARGV[4] client's now (unix ms).
-- Returns nil when granted, else an estimate of the wait in ms.

-- 1. drop waiters at the head of the queue whose give-up time has passed
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

-- 2. free lock, and nobody queued or we are the head: take it
if (redis.call('exists', KEYS[1]) == 0)
    and ((redis.call('exists', KEYS[2]) == 0)
      or (redis.call('lindex', KEYS[2], 0) == ARGV[2])) then
  redis.call('lpop', KEYS[2])
  redis.call('zrem', KEYS[3], ARGV[2])
  -- everyone left in the queue moves up: shorten their give-up times
  local keys = redis.call('zrange', KEYS[3], 0, -1)
  for i = 1, #keys, 1 do
    redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), keys[i])
  end
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end

-- 3. reentrant acquisition
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end

-- 4. already queued: report the estimated wait
local timeout = redis.call('zscore', KEYS[3], ARGV[2])
if timeout ~= false then
  return timeout - tonumber(ARGV[3]) - tonumber(ARGV[4])
end

-- 5. join the queue behind the last waiter
local last = redis.call('lindex', KEYS[2], -1)
local ttl
if last ~= false and last ~= ARGV[2] then
  ttl = tonumber(redis.call('zscore', KEYS[3], last)) - tonumber(ARGV[4])
else
  ttl = redis.call('pttl', KEYS[1])
end
local give_up = ttl + tonumber(ARGV[3]) + tonumber(ARGV[4])
if redis.call('zadd', KEYS[3], give_up, ARGV[2]) == 1 then
  redis.call('rpush', KEYS[2], ARGV[2])
end
return ttl
