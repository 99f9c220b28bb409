-- Renew leases in one round trip: the watchdog's batch, or one lease (a
-- nested call's extension). A lease is only ever lengthened: a renewal sent
-- before an extension may land after it, and the holder counts on the
-- extension.
--
-- KEYS[i]      the lock key of lease i
-- ARGV[2i-1]   holder id of lease i (the value may carry a waiter's `+w`)
-- ARGV[2i]     new lease length of lease i in milliseconds, an integer >= 1
--
-- Returns {r1, r2, ...}: ri is 1 when lease i was renewed, 0 when its key is
-- gone or held by someone else (that holder has lost the lock).
--
-- A shared lock's holder (acquire_shared.lua) is a member of a sorted set,
-- scored by the server-clock instant its lease ends.
--
-- Every ttl is checked before the first write: a script that fails midway
-- keeps the renewals it already made.

if #ARGV ~= 2 * #KEYS then
  return redis.error_reply('ERR expected a holder and a ttl per key')
end
for i = 1, #KEYS do
  if not is_ms(ARGV[2 * i]) then
    return redis.error_reply('ERR bad ttl')
  end
end

local now = nil
local function renew_member(key, member, ttl)
  local ends = redis.pcall('ZSCORE', key, member)
  if type(ends) ~= 'string' then
    return 0
  end
  if not now then
    now = now_ms()
  end
  if tonumber(ends) <= now then
    return 0
  end
  if tonumber(ends) < now + ttl then
    redis.call('ZADD', key, now + ttl, member)
  end
  lengthen(key, ttl)
  return 1
end

local renewed = {}
for i, key in ipairs(KEYS) do
  local holder = ARGV[2 * i - 1]
  -- A shared lock's holder id carries its role in front (`r:`, `w:`, `p:`).
  if string.match(holder, '^[rwp]:') then
    renewed[i] = renew_member(key, holder, tonumber(ARGV[2 * i]))
  else
    local current = redis.pcall('GET', key)
    if current == holder or current == holder .. '+w' then
      lengthen(key, ARGV[2 * i])
      renewed[i] = 1
    else
      renewed[i] = 0
    end
  end
end
return renewed
