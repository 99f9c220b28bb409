-- An election's leader says what it leads with (`LockClient::election`):
-- its record is written if, and only if, it still holds the election's
-- lock, and observers are told on the election's channel.
--
-- KEYS[1]  the election's lock `P{K}:leader`
-- KEYS[2]  its record `P{K}:leader:value`
-- KEYS[3]  its channel `P{K}:leader:released`
-- ARGV[1]  the leader's holder id
-- ARGV[2]  the value
-- ARGV[3]  'publish' on one node, 'spublish' on a cluster
--
-- Returns 1 written, 0 the lock is gone or held by someone else.
--
-- The record is `<holder id>\n<value>`: it names the term it belongs to, so
-- a reader that finds another holder on the lock knows the value is not the
-- current leader's. It has no TTL (like the fence counter: one small key per
-- election name); a stale record is never read as current.

if ARGV[3] ~= 'publish' and ARGV[3] ~= 'spublish' then
  return redis.error_reply('ERR bad announce command')
end
local current = redis.pcall('GET', KEYS[1])
if current ~= ARGV[1] and current ~= ARGV[1] .. '+w' then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1] .. '\n' .. ARGV[2])
redis.call(ARGV[3], KEYS[3], 'proclaimed')
return 1
