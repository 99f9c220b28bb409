-- Release the locks of a set this holder still has: the undo of a set's
-- acquisition whose reply was lost, or that a Redlock could not confirm.
--
-- KEYS[1..n]     the lock keys `P{K}` of the set
-- KEYS[n+1..2n]  their release channels `P{K}:released`
-- ARGV[1]        holder id
-- ARGV[2]        'publish' on one node, 'spublish' on a cluster
--
-- Returns how many were released.

if ARGV[2] ~= 'publish' and ARGV[2] ~= 'spublish' then
  return redis.error_reply('ERR bad announce command')
end
local n = #KEYS / 2
if n < 1 or n ~= math.floor(n) then
  return redis.error_reply('ERR expected a channel per key')
end
local released = 0
for i = 1, n do
  local value = redis.pcall('GET', KEYS[i])
  if value == ARGV[1] or value == ARGV[1] .. '+w' then
    redis.call('DEL', KEYS[i])
    released = released + 1
    if value ~= ARGV[1] then
      redis.call(ARGV[2], KEYS[n + i], ARGV[1])
    end
  end
end
return released
