-- Exclusive releases: one caller's, or several callers' bound for one node
-- sent as one call (backend/redis/coalesce.rs), so that the server runs one
-- script instead of one per caller.
--
-- ARGV[1]      'publish' on one node, 'spublish' on a cluster (one release
--              per call there: its keys share one slot)
-- Release i (from 1):
-- KEYS[2i-1]   the lock key `P{K}`
-- KEYS[2i]     its release channel `P{K}:released`
-- ARGV[i+1]    the holder id (an exclusive lock's)
--
-- Returns one integer per release, in order: 1 released, 0 the key is gone
-- or held by someone else. A release is announced only when a waiter marked
-- the lock (`+w`): most releases have nobody waiting, and a PUBLISH costs
-- about as much as the rest. DEL is the only write, so a release succeeds
-- when the server is out of memory (DEL and PUBLISH are not refused then).

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
