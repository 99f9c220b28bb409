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

-- The server's clock in milliseconds: shared locks score their holders'
-- leases with it.
local function now_ms()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end

