-- Take any one free segment of a segmented lock for one holder, in one
-- round trip. Each segment is an exclusive lock, as in acquire.lua.
--
-- KEYS[1..n]      the segment keys `P{K}#0 … P{K}#(n-1)`, one slot
-- KEYS[n+1..2n]   their fence counters, given only when ARGV[3] == '1'
-- ARGV[1]         holder id, `<hex>:<decimal>`
-- ARGV[2]         lease length in milliseconds, an integer >= 1
-- ARGV[3]         '1' to issue a fencing token, '0' not to
-- ARGV[4]         '1' if the caller will wait: held segments are then marked
--                 `+w` so that their releases are announced; '0' not to
-- ARGV[5]         n, the number of segments
--
-- Returns one of
--   {1, index, token}   segment `index` (from 0) acquired
--   {0, pttl}           every segment held; pttl is what is left of the lease
--                       that ends soonest (-1 when none has an expiry)
--   {-1, type}          no segment can ever free: each holds a value that
--                       never expires
--
-- Every argument is checked before the first write.

local refused = refuse_attempt('^%x+:%d+$')
if refused then
  return refused
end
local holder = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[5])
local fencing = ARGV[3] == '1'
if not n or n < 1 or n ~= math.floor(n) or #KEYS ~= (fencing and 2 * n or n) then
  return redis.error_reply('ERR bad segment count')
end

local function token(i)
  if fencing then
    return redis.call('INCR', KEYS[n + i])
  end
  return 0
end

-- MGET shows keys of other types as missing; SET NX then tells them apart.
local values = redis.call('MGET', unpack(KEYS, 1, n))
-- An earlier attempt of this same acquisition may have been applied with
-- its reply lost: then one segment is ours already, and taking a second
-- would hold two.
for i = 1, n do
  if values[i] == holder or values[i] == holder .. '+w' then
    -- Its lease only lengthens (this may be a late copy).
    lengthen(KEYS[i], ttl)
    if fencing then
      return {1, i - 1, tonumber(redis.call('GET', KEYS[n + i]) or '0')}
    end
    return {1, i - 1, 0}
  end
end

local soonest, never_frees = nil, nil
for i = 1, n do
  local value = values[i]
  if not value then
    if redis.call('SET', KEYS[i], holder, 'NX', 'PX', ttl) then
      return {1, i - 1, token(i)}
    end
    never_frees = redis.call('TYPE', KEYS[i])['ok']
  else
    local pttl = redis.call('PTTL', KEYS[i])
    local ours = string.match(value, '^%x+:%d+$')
    local marked = string.match(value, '^%x+:%d+%+w$')
    if pttl > 0 then
      if not soonest or pttl < soonest then
        soonest = pttl
      end
      if ARGV[4] == '1' and ours then
        redis.call('APPEND', KEYS[i], '+w')
      end
    elseif not ours and not marked then
      never_frees = 'string'
    end
  end
end
if soonest then
  return {0, soonest}
end
if never_frees then
  return {-1, never_frees}
end
return {0, -1}
