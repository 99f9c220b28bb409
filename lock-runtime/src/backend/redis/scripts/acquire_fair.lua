-- Take a fair lock for one holder, in one round trip: an exclusive lock (a
-- string, as in acquire.lua) handed to its waiters in the order they came.
--
-- KEYS[1]  the lock key `P{K}`: the holder id `f:<id>`, with a PTTL
-- KEYS[2]  the fence counter `P{K}:fence` (written only when ARGV[3] == '1')
-- KEYS[3]  the line `P{K}:line`: a sorted set of the waiters, scored by
--          their place (each newcomer one past the last)
-- KEYS[4]  `P{K}:alive`: the same waiters, scored with the server-clock
--          instant (ms) at which each one's place lapses unless it attempts
--          again
-- ARGV[1]  holder id, `f:<hex>:<decimal>`
-- ARGV[2]  lease length in milliseconds, an integer >= 1
-- ARGV[3]  '1' to issue a fencing token, '0' not to
-- ARGV[4]  '1' if the caller will wait: it takes (or keeps) its place in
--          line; '0' if not: a place it had is given up
-- ARGV[5]  how long a place lasts without an attempt (ms)
--
-- Returns one of
--   {1, token}            acquired (token 0 when ARGV[3] is '0')
--   {0, pttl, queued}     the lock is held, or free but owed to an earlier
--                         waiter; pttl is what is left of the lease (or of
--                         that waiter's place); queued is 1 when the caller
--                         is in line
--   {-1, type}            a value that never frees sits at KEYS[1]
--
-- Every argument is checked before the first write.

local refused = refuse_attempt('^f:%x+:%d+$')
if refused then
  return refused
end
if not is_ms(ARGV[5]) then
  return redis.error_reply('ERR bad waiter timeout')
end
local holder = ARGV[1]
local ttl = tonumber(ARGV[2])
local place_ttl = tonumber(ARGV[5])

local found = redis.call('TYPE', KEYS[1])['ok']
if found ~= 'string' and found ~= 'none' then
  return {-1, found}
end
local now = now_ms()
-- Waiters that stopped attempting (their process died) lose their place.
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for _, waiter in ipairs(lapsed) do
  redis.call('ZREM', KEYS[3], waiter)
end
if #lapsed > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
end

local function leave_line()
  redis.call('ZREM', KEYS[3], holder)
  redis.call('ZREM', KEYS[4], holder)
end

local current = redis.call('GET', KEYS[1])
if current == holder then
  -- An earlier attempt of this acquisition was applied, its reply lost.
  -- Its lease only lengthens (this may be a late copy).
  lengthen(KEYS[1], ttl)
  leave_line()
  if ARGV[3] == '1' then
    return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
  end
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if not current and (not first or first == holder) then
  redis.call('SET', KEYS[1], holder, 'PX', ttl)
  leave_line()
  if ARGV[3] == '1' then
    return {1, redis.call('INCR', KEYS[2])}
  end
  return {1, 0}
end

local pttl
if current then
  pttl = redis.call('PTTL', KEYS[1])
  -- Ours, or another library's lock with an expiry: a holder to wait for.
  -- A foreign string without one never frees.
  local ours = string.match(current, '^f:%x+:%d+$') or string.match(current, '^%x+:%d+')
  if pttl < 0 and not ours then
    return {-1, 'string'}
  end
else
  pttl = tonumber(redis.call('ZSCORE', KEYS[4], first)) - now
end
local queued = 0
if ARGV[4] == '1' then
  if not redis.call('ZSCORE', KEYS[3], holder) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    redis.call('ZADD', KEYS[3], (tonumber(last[2]) or 0) + 1, holder)
  end
  redis.call('ZADD', KEYS[4], now + place_ttl, holder)
  -- The line goes when its last waiter's place would have.
  redis.call('PEXPIRE', KEYS[3], place_ttl)
  redis.call('PEXPIRE', KEYS[4], place_ttl)
  queued = 1
else
  -- A last try, or a caller that does not wait: no place kept. Without
  -- this, a caller whose wait ran out stood first in line until its place
  -- lapsed, and a free lock went to nobody for that long.
  leave_line()
end
return {0, pttl, queued}
