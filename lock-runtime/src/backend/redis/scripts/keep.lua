-- Keep an exclusive lock held after its holder let go (`hold_at_least`):
-- its lease is set to end ARGV[2] ms from now, by this server's clock,
-- whether that is sooner or later than its current end. Nothing is
-- announced: the lock is still held.
--
-- KEYS[1]  the lock key `P{K}`
-- ARGV[1]  the holder id (an exclusive lock's)
-- ARGV[2]  what is left of the hold in milliseconds, an integer >= 1
--
-- Returns 1 kept, 0 the key is gone or held by someone else.

if not is_ms(ARGV[2]) then
  return redis.error_reply('ERR bad hold')
end
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[1] or current == ARGV[1] .. '+w' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
