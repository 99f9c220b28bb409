-- One exclusive release sent alone: what coalesced.lua does for a batch of
-- one, without the batch's loop and its array reply. Building and sending
-- that array cost a lone release about a third of its server time
-- (redis-benchmark, 200,000 calls, this project's VM: 3.7-4.9 µs a call
-- here against 5.0-7.6 for coalesced.lua with one release, and 5.8-6.8
-- for coalesced.lua with a one-release fast path still replying with an
-- array).
--
-- KEYS[1]  the lock key `P{K}`
-- KEYS[2]  its release channel `P{K}:released`
-- ARGV[1]  'publish' on one node, 'spublish' on a cluster
-- ARGV[2]  the holder id (an exclusive lock's)
--
-- Returns 1 released, 0 the key is gone or held by someone else. Announced
-- only when a waiter marked the lock (`+w`). DEL is the only write, so a
-- release succeeds when the server is out of memory.

if ARGV[1] ~= 'publish' and ARGV[1] ~= 'spublish' then
  return redis.error_reply('ERR bad announce command')
end
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
if current == ARGV[2] .. '+w' then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[1], KEYS[2], ARGV[2])
  return 1
end
return 0
