-- Take the lock for one holder, in one round trip.
--
-- KEYS[1]  the lock key `P{K}`: a string holding the holder id (followed by
--          `+w` once someone waits for it), with a PTTL
-- KEYS[2]  the fence counter `P{K}:fence` (written only when ARGV[3] == '1')
-- ARGV[1]  holder id, `<hex>:<decimal>`
-- ARGV[2]  lease length in milliseconds, an integer >= 1
-- ARGV[3]  '1' to issue a fencing token, '0' not to
-- ARGV[4]  '1' if the caller will wait for a release: a held lock is then
--          marked `+w` so that its release is announced; '0' not to
--
-- Returns one of
--   {1, token}      acquired (token 0 when ARGV[3] is '0')
--   {0, pttl}       held by another holder (ours, or another library's string
--                   with an expiry); pttl is -1 when our value has no expiry
--   {-1, type}      a value that never frees sits at KEYS[1]: another type,
--                   or a foreign string without an expiry
--
-- Every argument is checked before the first write: a script that fails
-- midway keeps the writes it already made.

local refused = refuse_attempt('^%x+:%d+$')
if refused then
  return refused
end
local holder = ARGV[1]
local ttl = tonumber(ARGV[2])

if redis.call('SET', KEYS[1], holder, 'NX', 'PX', ttl) then
  if ARGV[3] == '1' then
    return {1, redis.call('INCR', KEYS[2])}
  end
  return {1, 0}
end

local found = redis.call('TYPE', KEYS[1])['ok']
if found ~= 'string' then
  return {-1, found}
end
local current = redis.call('GET', KEYS[1])
if current == holder or current == holder .. '+w' then
  -- An earlier attempt of this same acquisition was applied but its reply was
  -- lost (timeout, dropped connection): the lock is ours. Its lease only
  -- lengthens: this may be a late copy, landing after an extension.
  lengthen(KEYS[1], ttl)
  if ARGV[3] == '1' then
    return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
  end
  return {1, 0}
end
local pttl = redis.call('PTTL', KEYS[1])
local ours = string.match(current, '^%x+:%d+$')
local marked = string.match(current, '^%x+:%d+%+w$')
if not ours and not marked then
  -- Another library's lock (redis-py's `Lock`, node-redlock, a plain
  -- `SET NX PX`): a string with an expiry is a holder that frees by its
  -- release or its expiry, so wait for it like for any holder. It is never
  -- written to: its owner compares the value on release. A string without
  -- an expiry never frees: that is a conflict, not a holder.
  if pttl > 0 then
    return {0, pttl}
  end
  return {-1, 'string'}
end
-- A key of ours without expiry was not written by a live holder: leave it
-- untouched. APPEND keeps the key's expiry.
if ARGV[4] == '1' and ours and pttl > 0 then
  redis.call('APPEND', KEYS[1], '+w')
end
return {0, pttl}
