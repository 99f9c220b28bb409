-- An election's leader says what it leads with (`LockClient::election`):
-- its record is written if, and only if, it still holds the election's
-- lock. Nothing is published: the election's channel carries releases,
-- and a message there would wake a waiting candidate for nothing.
--
-- KEYS[1]  the election's lock `P{K}:leader`
-- KEYS[2]  its record `P{K}:leader:value`
-- ARGV[1]  the leader's holder id
-- ARGV[2]  the value
--
-- Returns 1 written, 0 the lock is gone or held by someone else.
--
-- The record is `<holder id>\n<value>`: it names the term it belongs to, so
-- a reader that finds another holder on the lock knows the value is not the
-- current leader's. It has no TTL (like the fence counter: one small key per
-- election name); a stale record is never read as current.

local current = redis.pcall('GET', KEYS[1])
if current ~= ARGV[1] and current ~= ARGV[1] .. '+w' then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1] .. '\n' .. ARGV[2])
return 1
