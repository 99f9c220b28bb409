-- Release a fair or shared lock if, and only if, this holder still has it.
-- (An exclusive holder's release, alone or with others, is coalesced.lua.)
--
-- KEYS[1]  the lock key `P{K}`
-- KEYS[2]  the release channel `P{K}:released`
-- KEYS[3]  for a fair lock (holder `f:<id>`): its line `P{K}:line`
-- KEYS[4]  for a fair lock: its waiters' places `P{K}:alive`
-- ARGV[1]  holder id
-- ARGV[2]  'publish' on one node, 'spublish' on a cluster (sharded pub/sub,
--          delivered by the shard that owns the lock's slot)
--
-- Returns 1 when released, 0 when the key is gone or held by someone else.
--
-- Holder ids carry their lock's kind in front:
-- - `f:` a fair lock (acquire_fair.lua): the holder also leaves the line,
--   and the first live waiter is woken by name;
-- - `r:`, `w:`, `p:` a shared lock (read-write or semaphore,
--   acquire_shared.lua), a sorted set of holders: its holder's member goes,
--   with the writer's claim if any, and the release is always announced
--   (any release may let waiters in).
--
-- DEL comes first and nothing here allocates before it, so a release still
-- succeeds when the server is out of memory (DEL and PUBLISH are not refused
-- under OOM); the lock must free even when nothing else can be written.

if ARGV[2] ~= 'publish' and ARGV[2] ~= 'spublish' then
  return redis.error_reply('ERR bad announce command')
end
if string.sub(ARGV[1], 1, 2) == 'f:' then
  -- A fair lock (acquire_fair.lua); KEYS[3] is its line, KEYS[4] its
  -- waiters' places. A waiter that gives up leaves the line too.
  local released = 0
  if redis.pcall('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    released = 1
  end
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  if redis.call('EXISTS', KEYS[1]) == 0 then
    -- The first live waiter is woken, by name: the others stay asleep.
    wake_first_in_line(KEYS[3], KEYS[4], KEYS[2], ARGV[2])
  end
  return released
end

if string.match(ARGV[1], '^[rwp]:') then
  local ends = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
  if type(ends) == 'table' then
    -- Not a sorted set.
    return 0
  end
  local released = 0
  if ends then
    local now = now_ms()
    -- A member whose lease has ended goes, but it was no longer held.
    released = tonumber(ends) > now and 1 or 0
  end
  local removed = redis.call('ZREM', KEYS[1], ARGV[1])
  local writer = string.match(ARGV[1], '^w:(.+)$')
  if writer then
    removed = removed + redis.call('ZREM', KEYS[1], 'q:' .. writer)
  end
  if removed > 0 then
    redis.call(ARGV[2], KEYS[2], ARGV[1])
  end
  return released
end

-- An exclusive holder's release is coalesced.lua's (backend/redis.rs).
return redis.error_reply('ERR release.lua takes fair and shared holders only')
