-- Take a shared lock for one holder, in one round trip: a side of a
-- read-write lock, or one permit of a semaphore.
--
-- KEYS[1]  the lock key `P{K}`: a sorted set whose members are the holders
--          and whose scores are the server-clock instants (ms) at which their
--          leases end; the key's own PTTL outlasts every member
-- KEYS[2]  the fence counter `P{K}:fence` (written only when ARGV[3] == '1')
-- ARGV[1]  the member: `r:<id>` a reader, `w:<id>` a writer, `p:<id>` a
--          permit holder, where <id> is `<hex>:<decimal>`
-- ARGV[2]  lease length in milliseconds, an integer >= 1
-- ARGV[3]  '1' to issue a fencing token, '0' not to
-- ARGV[4]  '1' if the caller will wait; a writer that waits leaves a claim
--          `q:<id>` that holds new readers back, so that a stream of readers
--          cannot starve it; '0' not to
-- ARGV[5]  the number of permits, or '0' for a read-write lock
-- ARGV[6]  how long a claim lasts (ms) unless the writer's next attempt
--          renews it: a writer that dies holds readers back that long
--
-- Returns one of
--   {1, token}              acquired (token 0 when ARGV[3] is '0')
--   {0, pttl, claimed}      held: pttl is what is left of the shortest lease in
--                           the way; claimed is 1 when a claim was left
--   {-1, type}              the key holds something else: another type, or a
--                           lock of the other kind
--
-- Every argument is checked before the first write.

local refused = refuse_attempt('^[rwp]:%x+:%d+$')
if refused then
  return refused
end
local member = ARGV[1]
local ttl = tonumber(ARGV[2])
local permits = tonumber(ARGV[5])
if not permits or permits < 0 or permits ~= math.floor(permits) then
  return redis.error_reply('ERR bad permit count')
end
local side, id = string.match(member, '^([rwp]):(.+)$')
if (side == 'p') ~= (permits > 0) then
  return redis.error_reply('ERR bad holder id')
end
if not is_ms(ARGV[6]) then
  return redis.error_reply('ERR bad claim ttl')
end
local claim_ttl = tonumber(ARGV[6])

local found = redis.call('TYPE', KEYS[1])['ok']
if found ~= 'zset' and found ~= 'none' then
  return {-1, found}
end

local now = now_ms()
local function token()
  if ARGV[3] == '1' then
    return redis.call('INCR', KEYS[2])
  end
  return 0
end

-- Free: the common case, in as few calls as it takes.
if found == 'none' then
  redis.call('ZADD', KEYS[1], now + ttl, member)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, token()}
end

-- Someone else's sorted set, or the other kind of lock: left untouched (one
-- member tells, since a key only ever holds one kind).
local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if string.match(first, '^[rwq]:%x+:%d+$') then
  if permits > 0 then
    return {-1, 'read-write lock'}
  end
elseif string.match(first, '^p:%x+:%d+$') then
  if permits == 0 then
    return {-1, 'semaphore'}
  end
else
  return {-1, 'zset'}
end
-- A lease whose end has come is over, whether or not its holder knows.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

local function outlast(ms)
  lengthen(KEYS[1], ms)
end

-- An earlier attempt of this same acquisition may have been applied with
-- its reply lost: then the lock is ours already.
local admitted = redis.call('ZSCORE', KEYS[1], member) ~= false
local pttl = -1
if not admitted then
  if permits > 0 then
    admitted = redis.call('ZCARD', KEYS[1]) < permits
    if not admitted then
      pttl = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - now
    end
  else
    admitted = true
    -- Ascending by lease end: the first member in the way ends soonest.
    local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
      local other = string.sub(all[i], 1, 1)
      -- A reader yields to a writer and to a writer's claim; a writer to
      -- every holder, but not to another writer's claim.
      if (side == 'r' and other ~= 'r') or (side == 'w' and other ~= 'q') then
        admitted = false
        pttl = tonumber(all[i + 1]) - now
        break
      end
    end
  end
end

if not admitted then
  local claimed = 0
  if side == 'w' and ARGV[4] == '1' then
    redis.call('ZADD', KEYS[1], now + claim_ttl, 'q:' .. id)
    outlast(claim_ttl)
    claimed = 1
  end
  return {0, pttl, claimed}
end

-- An earlier attempt's lease only lengthens (this may be a late copy).
local ends = redis.call('ZSCORE', KEYS[1], member)
local again = ends ~= false
if not again or tonumber(ends) < now + ttl then
  redis.call('ZADD', KEYS[1], now + ttl, member)
end
if side == 'w' then
  redis.call('ZREM', KEYS[1], 'q:' .. id)
end
outlast(ttl)
if again and ARGV[3] == '1' then
  -- An earlier attempt's token stands.
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {1, token()}
