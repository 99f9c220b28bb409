-- Release whichever segments of a segmented lock this holder has: the undo
-- of an acquisition whose reply was lost, which may have taken any one.
--
-- KEYS[1..n]  the segment keys `P{K}#0 … P{K}#(n-1)`
-- KEYS[n+1]   the lock's release channel `P{K}:released`
-- ARGV[1]     holder id
-- ARGV[2]     'publish' on one node, 'spublish' on a cluster
--
-- Returns the number of segments released (0 or 1 unless something is
-- badly wrong).

if ARGV[2] ~= 'publish' and ARGV[2] ~= 'spublish' then
  return redis.error_reply('ERR bad announce command')
end
local n = #KEYS - 1
if n < 1 then
  return redis.error_reply('ERR bad segment count')
end
local values = redis.call('MGET', unpack(KEYS, 1, n))
local released = 0
for i = 1, n do
  if values[i] == ARGV[1] or values[i] == ARGV[1] .. '+w' then
    redis.call('DEL', KEYS[i])
    released = released + 1
    if values[i] ~= ARGV[1] then
      redis.call(ARGV[2], KEYS[n + 1], ARGV[1])
    end
  end
end
return released
