-- Frees a lock whatever holds it (`lockctl unlock KEY --force`): the
-- operator's way out when a holder is stuck. The holder learns at its next
-- renewal, which finds the lock gone; waiters are woken now. The fence
-- counter stays: tokens must keep growing across the forced release.
--
-- KEYS[1]  the lock key `P{K}` (or a segment's, `P{K}#i`)
-- KEYS[2]  the release channel `P{K}:released`
-- KEYS[3]  a fair lock's line `P{K}:line`
-- KEYS[4]  a fair lock's waiters' places `P{K}:alive`
-- ARGV[1]  'publish' on one node, 'spublish' on a cluster
--
-- Returns 1 when a lock was freed, 0 when there was none, and {-1, type}
-- when the key holds something this library did not write (left alone).

if ARGV[1] ~= 'publish' and ARGV[1] ~= 'spublish' then
  return redis.error_reply('ERR bad announce command')
end
local found = redis.call('TYPE', KEYS[1])['ok']
if found == 'none' then
  return 0
end
if found == 'string' then
  local holder = redis.call('GET', KEYS[1])
  local fair = string.match(holder, '^f:%x+:%d+$')
  if not fair and not string.match(holder, '^%x+:%d+$') and not string.match(holder, '^%x+:%d+%+w$') then
    return {-1, 'string'}
  end
  redis.call('DEL', KEYS[1])
  if fair then
    -- The next in line is woken by name, as by a release.
    wake_first_in_line(KEYS[3], KEYS[4], KEYS[2], ARGV[1])
  else
    -- A `w:` announcement wakes every waiter of the lock in each process.
    redis.call(ARGV[1], KEYS[2], 'w:forced')
  end
  return 1
end
if found == 'zset' then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if first and not string.match(first, '^[rwqp]:%x+:%d+$') then
    return {-1, 'zset'}
  end
  -- Every reader, writer, permit and writer's claim goes at once.
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[1], KEYS[2], 'w:forced')
  return 1
end
return {-1, found}
