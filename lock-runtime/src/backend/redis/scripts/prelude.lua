-- Put in front of every script when it is built (see `backend/redis.rs`):
-- the argument checks and the clock the scripts share.

-- A length in milliseconds: an integer from 1 to 10^12.
local function is_ms(value)
  if value == nil then
    return false
  end
  local ms = tonumber(value)
  return ms ~= nil and ms >= 1 and ms <= 1e12 and ms == math.floor(ms)
end

-- A flag: '0' or '1'.
local function is_flag(value)
  return value == '0' or value == '1'
end

-- Checks what every acquire script takes first: ARGV[1] the holder id
-- (matching `shape`), ARGV[2] the lease in ms, ARGV[3] the fencing flag and
-- ARGV[4] the waiting flag. Returns the error reply for the first bad one,
-- or nil.
local function refuse_attempt(shape)
  if type(ARGV[1]) ~= 'string' or not string.match(ARGV[1], shape) then
    return redis.error_reply('ERR bad holder id')
  end
  if not is_ms(ARGV[2]) then
    return redis.error_reply('ERR bad ttl')
  end
  if not is_flag(ARGV[3]) then
    return redis.error_reply('ERR bad fencing flag')
  end
  if not is_flag(ARGV[4]) then
    return redis.error_reply('ERR bad waiting flag')
  end
  return nil
end

-- `PEXPIRE … GT` (Redis 7.0 and later; `REDIS_VERSION_NUM` came with it).
local expire_takes_gt = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

-- Makes `key`'s lease last at least `ms` from now, never shorter. It always
-- writes (the remaining time, rounded up, when that is longer): a client
-- that asks for replica acknowledgements waits (WAIT) for its own writes,
-- and a renewal that wrote nothing would be confirmed without the replicas
-- having the longer expiry an earlier write, on another connection, set.
-- A renewal almost always lengthens: one `PEXPIRE … GT` does that, and
-- only when it declines (the lease is already longer) are `PTTL` and a
-- rewrite needed. A renewal cost the server 5.6-6.1 us of its CPU with
-- the two calls and costs 4.0-4.9 us with the one (`lock-bench` WSC,
-- Redis 7.0), and under a flood of acquisitions the server's time is what
-- renewals wait for.
-- `ms` may be the argument's string as it came: a number would be
-- formatted back into one for every call.
local function lengthen(key, ms)
  if expire_takes_gt and redis.call('PEXPIRE', key, ms, 'GT') == 1 then
    return
  end
  redis.call('PEXPIRE', key, math.max(redis.call('PTTL', key) + 1, tonumber(ms)))
end

-- The server's clock in milliseconds: shared locks score their holders'
-- leases with it.
local function now_ms()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end


-- Wakes the first live waiter of a fair lock, by name (its holder id as the
-- announcement), after dropping the waiters whose places lapsed. `line` is
-- `P{K}:line`, `alive` `P{K}:alive`, `channel` `P{K}:released`, `announce`
-- 'publish' or 'spublish'.
local function wake_first_in_line(line, alive, channel, announce)
  local now = now_ms()
  local lapsed = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
  for _, waiter in ipairs(lapsed) do
    redis.call('ZREM', line, waiter)
  end
  redis.call('ZREMRANGEBYSCORE', alive, '-inf', now)
  local first = redis.call('ZRANGE', line, 0, 0)[1]
  if first then
    redis.call(announce, channel, first)
  end
end
