-- The latest instant until which a direct-decision term one agent instance gave may be in use, in µs of Redis
-- time (regional-agent/terms/terms-until.ts): written before the term is answered, read by the instance's
-- successor at start, which waits for it before it is known to the coordinator. Written only upward.
--
-- KEYS[1] the instance's key (core/keys.ts termsUntilKey). ARGV[1] the instant to cover, µs (0: only read);
-- ARGV[2] when the key expires, Unix ms (PXAT), after the instant: the key cleans itself up once it says nothing.
-- Returns { the instant recorded now (0: none), Redis TIME now }, both in µs.

-- @include prelude

if argc ~= 2 or #KEYS ~= 1 then return fail('expected 2 arguments and 1 key, got ' .. argc .. ' and ' .. #KEYS) end
local want, expire_at = tonumber(ARGV[1]), tonumber(ARGV[2])
if not int(want, 0) then return fail('the instant must be an integer >= 0') end
if not int(expire_at, 0) then return fail('the expiry must be an integer >= 0') end
local now = clock()
local recorded = tonumber(call('GET', KEYS[1])) or 0
if want > recorded then
  if expire_at * 1000 <= want then return fail('the key must expire after the instant it records') end
  call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
  recorded = want
end
return { recorded, now }
