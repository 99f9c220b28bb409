-- Exclusive releases of several callers, bound for one node, sent as one
-- call (backend/redis/coalesce.rs): the server runs one script instead of
-- one per caller, and the client encodes and decodes one command.
--
-- ARGV[1]      'publish' (calls are coalesced on one node only)
-- Release i (from 1):
-- KEYS[2i-1]   the lock key `P{K}`
-- KEYS[2i]     its release channel `P{K}:released`
-- ARGV[i+1]    the holder id (an exclusive lock's)
--
-- Returns one integer per release, in order, as release.lua does for an
-- exclusive holder: 1 released, 0 the key is gone or held by someone else.
-- A release is announced only when a waiter marked the lock (`+w`).

if ARGV[1] ~= 'publish' and ARGV[1] ~= 'spublish' then
  return redis.error_reply('ERR bad announce command')
end
local n = #KEYS / 2
if n < 1 or n ~= math.floor(n) or #ARGV ~= n + 1 then
  return redis.error_reply('ERR expected a channel and a holder per key')
end
local results = {}
for i = 1, n do
  local key, holder = KEYS[2 * i - 1], ARGV[i + 1]
  local current = redis.pcall('GET', key)
  if current == holder then
    redis.call('DEL', key)
    results[i] = 1
  elseif current == holder .. '+w' then
    redis.call('DEL', key)
    redis.call(ARGV[1], KEYS[2 * i], holder)
    results[i] = 1
  else
    results[i] = 0
  end
end
return results
