-- tokio-ratelimit: a look at a key that changes nothing, not even its expiry:
-- the server's clock (whole microseconds) and the key's state (false when
-- absent). The client decides from these exactly as gcra.lua would.
local t = redis.call('TIME')
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), redis.call('GET', KEYS[1])}
