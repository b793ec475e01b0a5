-- tokio-ratelimit: one funnel (GCRA) decision over every band of a quota,
-- atomically, on the server's clock.
--
-- Every time is a pair (us, rem) = us * unit + rem scaled units, where unit is
-- the number of scaled units in a microsecond (its band's) and 0 <= rem < unit:
-- integers below 2^53 that Lua's doubles add, subtract and compare exactly
-- (see src/redis/repr.rs). Numbers are written with %.0f, never tostring
-- (which keeps only 14 digits).
--
-- KEYS[1]  the key's state: "<us> <rem> <unit>" per band, space separated,
--          each band's theoretical arrival time (when it is empty), absolute;
--          absent = every band empty. A band beyond the ones stored reads as
--          empty; stored bands beyond ARGV's are written back as they are.
-- ARGV     per band: unit, cost_us, cost_rem, tau_us, tau_rem
-- Returns  {1, now_us} when every band grants (n = 0 only reads), then every
--          band is written; {0, now_us, wait_us, wait_rem, ...} when some band
--          refuses: each band's wait in its own units (0, 0 where it grants),
--          nothing written.

local bands = #ARGV / 5

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- The stored bands: s_us[i], s_rem[i], s_unit[i]; kept = where the bands
-- beyond ours start in the string (nil: none).
local state = redis.call('GET', KEYS[1])
local s_us, s_rem, s_unit = {}, {}, {}
local stored, kept = 0, nil
if state then
  local pos, len = 1, #state
  while true do
    local _, e, a, b, c = string.find(state, '^(%d+) (%d+) (%d+)', pos)
    if e then
      a, b, c = tonumber(a), tonumber(b), tonumber(c)
    end
    if not e or b >= c or (e < len and (e + 1 == len or string.byte(state, e + 1) ~= 32)) then
      return redis.error_reply('tokio-ratelimit: malformed state at ' .. KEYS[1])
    end
    stored = stored + 1
    s_us[stored], s_rem[stored], s_unit[stored] = a, b, c
    if e == len then
      break
    end
    pos = e + 2
    if stored == bands then
      kept = pos
    end
  end
end

if ARGV[2] == '0' and ARGV[3] == '0' then
  return {1, now}
end

-- Each band: end = max(tat, now) + cost; water = end - now (now is whole
-- microseconds); it fits when water <= tau, else waits water - tau.
local e_us, e_rem, w = {}, {}, {}
local refused = false
for i = 1, bands do
  local k = (i - 1) * 5
  local unit = tonumber(ARGV[k + 1])
  local tau_us, tau_rem = tonumber(ARGV[k + 4]), tonumber(ARGV[k + 5])
  local b_us, b_rem = now, 0
  if i <= stored then
    local u, r = s_us[i], s_rem[i]
    if s_unit[i] ~= unit and r > 0 then
      -- Written under another rate: its fraction of a microsecond is in
      -- other units. Round the instant up (never frees water).
      u, r = u + 1, 0
    end
    if u > now or (u == now and r > 0) then
      b_us, b_rem = u, r
    end
  end
  local x_us, x_rem = b_us + tonumber(ARGV[k + 2]), b_rem + tonumber(ARGV[k + 3])
  if x_rem >= unit then
    x_us, x_rem = x_us + 1, x_rem - unit
  end
  e_us[i], e_rem[i] = x_us, x_rem
  local w_us = x_us - now
  if w_us < tau_us or (w_us == tau_us and x_rem <= tau_rem) then
    w[2 * i - 1], w[2 * i] = 0, 0
  else
    local r_us, r_rem = w_us - tau_us, x_rem - tau_rem
    if r_rem < 0 then
      r_us, r_rem = r_us - 1, r_rem + unit
    end
    w[2 * i - 1], w[2 * i] = r_us, r_rem
    refused = true
  end
end

if refused then
  local reply = {0, now}
  for i = 1, 2 * bands do
    reply[i + 2] = w[i]
  end
  return reply
end

-- Granted: every band written, and the key expires once every band has
-- drained: at or after the latest end, in whole milliseconds
-- (floor(us / 1000) + 1 >= ceil(end), as the state would read as empty from
-- then on anyway). Kept bands count too.
local last = 0
local out = ''
for i = 1, bands do
  local unit = ARGV[(i - 1) * 5 + 1]
  if i > 1 then
    out = out .. ' '
  end
  out = out .. string.format('%.0f %.0f ', e_us[i], e_rem[i]) .. unit
  if e_us[i] > last then
    last = e_us[i]
  end
end
if kept then
  out = out .. ' ' .. string.sub(state, kept)
  for i = bands + 1, stored do
    if s_us[i] > last then
      last = s_us[i]
    end
  end
end
redis.call('SET', KEYS[1], out)
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.floor(last / 1000) + 1))
return {1, now}
