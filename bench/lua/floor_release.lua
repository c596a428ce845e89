-- The floor's release: compare-and-delete for a lock taken with
-- `SET key owner NX PX ms`. Deletes the key only if it still holds our owner.
-- KEYS[1] lock key; ARGV[1] owner.
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
