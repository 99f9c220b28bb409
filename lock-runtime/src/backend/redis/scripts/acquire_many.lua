-- Take a set of exclusive locks for one holder, all or none, in one round
-- trip. Each lock is the string acquire.lua writes, so a set excludes the
-- single locks of its keys and the other way round.
--
-- KEYS[1..n]  the lock keys `P{K}` of the set, sorted (one node; one slot
--             on a cluster)
-- ARGV[1]     holder id, `<hex>:<decimal>`
-- ARGV[2]     lease length in milliseconds, an integer >= 1
-- ARGV[3]     '0' (a set has no fencing token)
-- ARGV[4]     '1' if the caller will wait: the lock in the way is then
--             marked `+w` so that its release is announced; '0' not to
--
-- Returns one of
--   {1, 0}               every lock acquired
--   {0, pttl, index}     lock `index` (from 0) is held: nothing was taken;
--                        pttl is what is left of its lease (-1: no expiry)
--   {-1, type, index}    lock `index` holds a value that never frees
--
-- Every lock is looked at before the first is written, so a set is taken
-- whole or not at all.

local refused = refuse_attempt('^%x+:%d+$')
if refused then
  return refused
end
if ARGV[3] ~= '0' then
  return redis.error_reply('ERR a set of locks has no fencing token')
end
local holder = ARGV[1]
local ttl = tonumber(ARGV[2])

-- MGET shows keys of other types as missing; TYPE tells them apart.
local values = redis.call('MGET', unpack(KEYS))
local ours = {}
for i, value in ipairs(values) do
  if value == holder or value == holder .. '+w' then
    -- An earlier attempt of this acquisition took it, its reply lost.
    ours[i] = true
  elseif not value then
    local found = redis.call('TYPE', KEYS[i])['ok']
    if found ~= 'none' then
      return {-1, found, i - 1}
    end
  else
    local pttl = redis.call('PTTL', KEYS[i])
    local library = string.match(value, '^%x+:%d+$')
    local marked = string.match(value, '^%x+:%d+%+w$')
    if pttl < 0 and not library and not marked then
      return {-1, 'string', i - 1}
    end
    if ARGV[4] == '1' and library and pttl > 0 then
      redis.call('APPEND', KEYS[i], '+w')
    end
    return {0, pttl, i - 1}
  end
end

for i, key in ipairs(KEYS) do
  if ours[i] then
    -- PEXPIRE keeps a waiter's `+w` mark; an earlier attempt's lease only
    -- lengthens (this may be a late copy).
    lengthen(key, ttl)
  else
    redis.call('SET', key, holder, 'PX', ttl)
  end
end
return {1, 0}
