-- The one-band decision script as released before quotas (kept verbatim
-- below this header for tests/redis.rs: a key it wrote must read correctly).
--
-- tokio-ratelimit: one funnel (GCRA) decision, atomically, on the server's clock.
--
-- Every time is a pair (us, rem) = us * unit + rem scaled units, where unit is
-- the number of scaled units in a microsecond and 0 <= rem < unit: integers
-- below 2^53 that Lua's doubles add, subtract and compare exactly (see
-- src/redis/repr.rs). Numbers are written with %.0f, never tostring (which
-- keeps only 14 digits).
--
-- KEYS[1]  the key's state: "<tat_us> <tat_rem> <unit>", the theoretical
--          arrival time (when the funnel is empty), absolute; absent = empty.
-- ARGV     unit, cost_us, cost_rem, tau_us, tau_rem
-- Returns  {1, now_us, 0, 0} when granted (n = 0 only reads),
--          {0, now_us, wait_us, wait_rem} when refused.

local unit = tonumber(ARGV[1])
local cost_us, cost_rem = tonumber(ARGV[2]), tonumber(ARGV[3])
local tau_us, tau_rem = tonumber(ARGV[4]), tonumber(ARGV[5])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- base = max(tat, now)
local b_us, b_rem = now, 0
local state = redis.call('GET', KEYS[1])
if state then
  local s_us, s_rem, s_unit = string.match(state, '^(%d+) (%d+) (%d+)$')
  if not s_us then
    return redis.error_reply('tokio-ratelimit: malformed state at ' .. KEYS[1])
  end
  s_us, s_rem, s_unit = tonumber(s_us), tonumber(s_rem), tonumber(s_unit)
  if s_unit ~= unit and s_rem > 0 then
    -- Written by a limiter with another rate: its fraction of a microsecond
    -- is in other units. Round the instant up (never frees water).
    s_us, s_rem = s_us + 1, 0
  end
  if s_us > now or (s_us == now and s_rem > 0) then
    b_us, b_rem = s_us, s_rem
  end
end

if cost_us == 0 and cost_rem == 0 then
  return {1, now, 0, 0}
end

-- end = base + cost
local e_us, e_rem = b_us + cost_us, b_rem + cost_rem
if e_rem >= unit then
  e_us, e_rem = e_us + 1, e_rem - unit
end

-- water = end - now (now is whole microseconds); it fits when water <= tau.
local w_us = e_us - now
if w_us < tau_us or (w_us == tau_us and e_rem <= tau_rem) then
  redis.call('SET', KEYS[1], string.format('%.0f %.0f %.0f', e_us, e_rem, unit))
  -- Expire once the funnel has drained: at or after `end`, in whole
  -- milliseconds (floor(e_us / 1000) + 1 >= ceil(end); the state would read
  -- as empty from `end` on anyway).
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.floor(e_us / 1000) + 1))
  return {1, now, 0, 0}
end

-- wait = water - tau
local r_us, r_rem = w_us - tau_us, e_rem - tau_rem
if r_rem < 0 then
  r_us, r_rem = r_us - 1, r_rem + unit
end
return {0, now, r_us, r_rem}
