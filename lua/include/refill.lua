-- The bucket rule every script that touches a token bucket shares (`-- @include refill`, after the prelude);
-- core/models/token-bucket.ts is its model. Nothing is minted:
--   - refill = elapsed * min(stored rate, new rate) + carry, elapsed = max(0, now - ts): a rate change never
--     mints, a clock step backwards refills nothing, and ts never moves backwards;
--   - tokens are clamped to min(stored capacity, new capacity): a shrink clamps at once, a grow only makes room
--     for refills after it is written;
--   - a bucket last written before floor_before (fb) refills at no more than floor_rate (fr), its stored tokens
--     clamped to floor_capacity (fc) first;
--   - a missing (expired) bucket is full, never more, and never more than the floor capacity when a floor
--     travels: it counts as written at time 0, before any floor, so a share that rose within the idle TTL mints
--     nothing for buckets that did not exist.

-- The bucket `h` (HMGET tk fr ts rt cp) refilled to `now` under capacity `cap` and rate `rate` (and the floor
-- fb, fr, fc): returns tokens, carry in [0, 1), ts, and the ceiling it is clamped to.
local function refill(h, now, cap, rate, fb, fr, fc)
  if not h[1] then
    if fb > 0 and fc < cap then return fc, 0, now, cap end
    return cap, 0, now, cap
  end
  local tokens = tonumber(h[1])
  local ts = tonumber(h[3])
  local r = min(tonumber(h[4]), rate)
  local ceiling = min(tonumber(h[5]), cap)
  if ts < fb then
    r = min(r, fr)
    tokens = min(tokens, fc)
  end
  local gained = max(0, now - ts) * r + tonumber(h[2])
  local whole = floor(gained)
  local carry = gained - whole
  tokens = tokens + whole
  if tokens >= ceiling then
    tokens = ceiling; carry = 0
  end
  return tokens, carry, max(ts, now), ceiling
end

-- Tokens handed back (credit.lua, grant.lua's return): what fits under the ceiling is added, the rest dropped.
-- Returns credited, dropped, tokens, carry (a full bucket keeps no carry).
local function add_tokens(tokens, carry, ceiling, amount)
  local credited = min(amount, max(0, ceiling - tokens))
  tokens = tokens + credited
  if tokens >= ceiling then carry = 0 end
  return credited, amount - credited, tokens, carry
end

-- µs until `tokens` (plus `carry`) refilled at `rate` reach `target`: 0 when they do already, -1 never.
local function micros_until(tokens, carry, target, rate)
  if tokens >= target then return 0 end
  if rate <= 0 then return -1 end
  local need = target - tokens - carry
  local us = ceil(need / rate)
  if us * rate + carry < target - tokens then us = us + 1 end
  return us
end

-- µs as ms rounded up; -1 (never) stays -1.
local function ms(us)
  if us < 0 then return -1 end
  return ceil(us / 1000)
end
