-- Renew (or extend) the lease of a lock this holder still has. A lease is
-- only ever lengthened: a renewal sent before an extension may land after
-- it, and the holder counts on the extension.
--
-- KEYS[1]  the lock key `P{K}`
-- ARGV[1]  holder id
-- ARGV[2]  lease length in milliseconds, an integer >= 1
--
-- Returns 1 when the lease is at least ARGV[2] long now, 0 when the key is
-- gone or held by someone else.
--
-- A shared lock's holder (acquire_shared.lua) is a member of a sorted set,
-- scored by the server-clock instant its lease ends.

local ttl = tonumber(ARGV[2])
if not is_ms(ttl) then
  return redis.error_reply('ERR bad ttl')
end
-- A shared lock's holder id carries its role in front (`r:`, `w:`, `p:`).
if string.match(ARGV[1], '^[rwp]:') then
  local ends = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
  if type(ends) ~= 'string' then
    return 0
  end
  local now = now_ms()
  if tonumber(ends) <= now then
    return 0
  end
  if tonumber(ends) < now + ttl then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  end
  lengthen(KEYS[1], ttl)
  return 1
end
local current = redis.pcall('GET', KEYS[1])
if current ~= ARGV[1] and current ~= ARGV[1] .. '+w' then
  return 0
end
lengthen(KEYS[1], ttl)
return 1
