-- Who leads an election now (`Election::leader`), read in one step so that
-- the lock, its epoch and its record agree. Reads only.
--
-- KEYS[1]  the election's lock `P{K}:leader`
-- KEYS[2]  its fence counter `P{K}:leader:fence` (the terms' epochs)
-- KEYS[3]  its record `P{K}:leader:value`
--
-- Returns {} when nobody leads, else {holder, epoch, record, pttl}: the
-- holder id (without the waiters' mark), the fence counter (every grant of
-- an election's lock is fenced, so it is the current term's epoch), the
-- record ('' when there is none) and the lock's PTTL in ms.

local current = redis.pcall('GET', KEYS[1])
if type(current) ~= 'string' then
  return {}
end
local holder = current
if string.sub(current, -2) == '+w' then
  holder = string.sub(current, 1, -3)
end
local record = redis.pcall('GET', KEYS[3])
if type(record) ~= 'string' then
  record = ''
end
return {holder, redis.call('GET', KEYS[2]) or '0', record, redis.call('PTTL', KEYS[1])}
