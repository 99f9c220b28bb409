-- Hand an exclusive lock from its holder straight to a waiter in the same
-- process (`handoff.rs`): one call instead of a release, an announcement and
-- the waiter's own attempt.
--
-- KEYS[1]  the lock key `P{K}`
-- KEYS[2]  the fence counter `P{K}:fence` (written only when ARGV[4] == '1')
-- ARGV[1]  the holder giving the lock away
-- ARGV[2]  the waiter taking it
-- ARGV[3]  the waiter's lease in milliseconds, an integer >= 1
-- ARGV[4]  '1' to issue the waiter a fencing token, '0' not to
--
-- Returns {1, token} handed over (token 0 when ARGV[4] is '0'), or {0, 0}
-- when the lock is no longer the giver's: then nothing was written. A mark
-- (`+w`) from waiters elsewhere passes to the new holder, so that its
-- release is announced to them.

local holder_shape = '^%x+:%d+$'
if type(ARGV[1]) ~= 'string' or not string.match(ARGV[1], holder_shape) then
  return redis.error_reply('ERR bad holder id')
end
if type(ARGV[2]) ~= 'string' or not string.match(ARGV[2], holder_shape) then
  return redis.error_reply('ERR bad waiter id')
end
if not is_ms(ARGV[3]) then
  return redis.error_reply('ERR bad ttl')
end
if not is_flag(ARGV[4]) then
  return redis.error_reply('ERR bad fencing flag')
end

local current = redis.pcall('GET', KEYS[1])
local taker
if current == ARGV[1] then
  taker = ARGV[2]
elseif current == ARGV[1] .. '+w' then
  taker = ARGV[2] .. '+w'
else
  return {0, 0}
end
-- The token first: should the server refuse a write, the lock must still be
-- the giver's (a counter that skips a number is harmless).
local token = 0
if ARGV[4] == '1' then
  token = redis.call('INCR', KEYS[2])
end
redis.call('SET', KEYS[1], taker, 'PX', tonumber(ARGV[3]))
return {1, token}
