-- tokio-ratelimit: one funnel (GCRA) decision over every band of a quota,
-- atomically, on the server's clock.
--
-- Every time is a pair (us, rem) = us * unit + rem scaled units, where unit is
-- the number of scaled units in a microsecond (its band's) and 0 <= rem < unit:
-- integers below 2^53 that Lua's doubles add, subtract and compare exactly
-- (see src/redis/repr.rs). Numbers are written with %d, never tostring (which
-- keeps only 14 digits): Lua 5.1 formats %d through a C long, exact for these
-- integers where long has 64 bits, which the write path checks first (a
-- 32-bit long would write garbage; %.0f is exact everywhere but costs twice
-- as much per number).
--
-- KEYS[1]  the key's state: "<us> <rem> <unit>" per band, space separated,
--          each band's theoretical arrival time (when it is empty), absolute;
--          absent = every band empty. A band beyond the ones stored reads as
--          empty; stored bands beyond ARGV's are written back as they are.
-- ARGV     per band: unit, cost_us, cost_rem, tau_us, tau_rem
-- Returns  {1, now_us, end_us, end_rem, ...} when every band grants, then
--          every band is written: each band's new instant (what the caller
--          shows as the state); {1, now_us} for n = 0 (a read);
--          {0, now_us, wait_us, wait_rem, ..., at_us, at_rem, ...} when some
--          band refuses: each band's wait in its own units (0, 0 where it
--          grants), then each band's instant as read (never before now),
--          nothing written.

local bands = #ARGV / 5

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- The stored bands, flat: s[3i - 2], s[3i - 1], s[3i] = band i's us, rem,
-- unit; kept = where the bands beyond ours start in the string (nil: none).
local state = redis.call('GET', KEYS[1])
local s = {}
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
    s[stored * 3 + 1], s[stored * 3 + 2], s[stored * 3 + 3] = a, b, c
    stored = stored + 1
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
-- microseconds); it fits when water <= tau, else waits water - tau. The
-- refusal's reply and the grant's new state are both built as we go.
local out = {}
local reply = {0, now}
local ends = {1, now}
local refused = false
local last = 0
for i = 1, bands do
  local k = (i - 1) * 5
  local unit = tonumber(ARGV[k + 1])
  local b_us, b_rem = now, 0
  if i <= stored then
    local j = (i - 1) * 3
    local u, r = s[j + 1], s[j + 2]
    if s[j + 3] ~= unit and r > 0 then
      -- Written under another rate: its fraction of a microsecond is in
      -- other units. Round the instant up (never frees water).
      u, r = u + 1, 0
    end
    if u > now or (u == now and r > 0) then
      b_us, b_rem = u, r
    end
  end
  reply[2 * bands + 2 * i + 1], reply[2 * bands + 2 * i + 2] = b_us, b_rem
  local x_us, x_rem = b_us + tonumber(ARGV[k + 2]), b_rem + tonumber(ARGV[k + 3])
  if x_rem >= unit then
    x_us, x_rem = x_us + 1, x_rem - unit
  end
  local w_us = x_us - now
  local tau_us, tau_rem = tonumber(ARGV[k + 4]), tonumber(ARGV[k + 5])
  if w_us < tau_us or (w_us == tau_us and x_rem <= tau_rem) then
    reply[2 * i + 1], reply[2 * i + 2] = 0, 0
  else
    local r_us, r_rem = w_us - tau_us, x_rem - tau_rem
    if r_rem < 0 then
      r_us, r_rem = r_us - 1, r_rem + unit
    end
    reply[2 * i + 1], reply[2 * i + 2] = r_us, r_rem
    refused = true
  end
  out[i] = string.format('%d %d ', x_us, x_rem) .. ARGV[k + 1]
  ends[2 * i + 1], ends[2 * i + 2] = x_us, x_rem
  if x_us > last then
    last = x_us
  end
end

if refused then
  return reply
end
if string.format('%d', 9007199254740992) ~= '9007199254740992' then
  return redis.error_reply('tokio-ratelimit: this Lua formats %d through a 32-bit long')
end
-- Granted: every band written, and the key expires once every band has
-- drained: at or after the latest end, in whole milliseconds
-- (floor(us / 1000) + 1 >= ceil(end), as the state would read as empty from
-- then on anyway). Kept bands count too.
if kept then
  out[bands + 1] = string.sub(state, kept)
  for i = bands, stored - 1 do
    if s[i * 3 + 1] > last then
      last = s[i * 3 + 1]
    end
  end
end
redis.call('SET', KEYS[1], table.concat(out, ' '))
redis.call('PEXPIREAT', KEYS[1], string.format('%d', math.floor(last / 1000) + 1))
return ends
