-- What an operator sees of one lock (`lockctl list` and `inspect`), read in
-- one step so that the parts agree. Reads only.
--
-- KEYS[1]  the lock key `P{K}` (or a segment's, `P{K}#i`)
-- KEYS[2]  its fence counter `P{K}:fence`
-- KEYS[3]  a fair lock's line `P{K}:line`
--
-- Returns {type, now, pttl, fence, waiting, ...}: the key's type, the
-- server's clock in ms, the key's PTTL, the fence counter ('' when there is
-- none), how many wait in a fair lock's line, then
-- - for a string (an exclusive or fair lock, a segment): its value;
-- - for a sorted set (a read-write lock, a semaphore): member, score, ...
--   (the score is the server-clock instant the member's lease ends).

local found = redis.call('TYPE', KEYS[1])['ok']
local fence = redis.pcall('GET', KEYS[2])
if type(fence) ~= 'string' then
  fence = ''
end
local waiting = redis.pcall('ZCARD', KEYS[3])
if type(waiting) ~= 'number' then
  waiting = 0
end
local reply = {found, now_ms(), redis.call('PTTL', KEYS[1]), fence, waiting}
if found == 'string' then
  table.insert(reply, redis.call('GET', KEYS[1]))
elseif found == 'zset' then
  for _, item in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')) do
    table.insert(reply, item)
  end
end
return reply
