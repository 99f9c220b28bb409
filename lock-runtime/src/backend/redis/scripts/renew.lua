-- Renew (or extend) the lease of a lock this holder still has.
--
-- KEYS[1]  the lock key `P{K}`
-- ARGV[1]  holder id
-- ARGV[2]  new lease length in milliseconds, an integer >= 1
-- ARGV[3]  '1' to only ever lengthen the remaining lease, '0' to set it
--
-- Returns 1 when the lease is (at least) ARGV[2] long now, 0 when the key is
-- gone or held by someone else.
--
-- A shared lock's holder (acquire_shared.lua) is a member of a sorted set,
-- scored by the server-clock instant its lease ends.

local ttl = tonumber(ARGV[2])
if not is_ms(ttl) then
  return redis.error_reply('ERR bad ttl')
end
if not is_flag(ARGV[3]) then
  return redis.error_reply('ERR bad extend flag')
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
  if ARGV[3] == '0' or tonumber(ends) < now + ttl then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  end
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return 1
end
local current = redis.pcall('GET', KEYS[1])
if current ~= ARGV[1] and current ~= ARGV[1] .. '+w' then
  return 0
end
if ARGV[3] == '1' and redis.call('PTTL', KEYS[1]) >= ttl then
  return 1
end
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
