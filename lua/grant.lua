--[[
grant.lua: a client's local grant of a subject's tokens (core/grants.ts is the model, operation for operation).
Mode 1 (take) refills the bucket on Redis time, exactly as token_bucket.lua would, then takes min(amount, stock):
the tokens leave the bucket before the client spends them, as a lend between regions does (lend.lua, fill).
Mode 2 (return) hands back what the client did not spend: refill, then add what fits under the lower of the
stored and the given capacity (credit.lua); the rest is dropped. Never below zero, never minted.

KEYS
  KEYS[1]  the subject's bucket hash (fields as in token_bucket.lua: tk micro-tokens, fr carry, ts µs, rt
           tokens/s, cp micro-tokens)

ARGV
  ARGV[1]  mode: 1 take, 2 return
  ARGV[2]  amount in micro-tokens (integer >= 1)
  ARGV[3]  capacity in micro-tokens (integer >= 0): this region's share of the burst
  ARGV[4]  refill in tokens per second (>= 0)
  ARGV[5]  idle TTL in milliseconds (integer >= 1)
  ARGV[6]  floor_before, ARGV[7] floor_rate, ARGV[8] floor_capacity: token_bucket.lua's rate-history floor
           (0 0 0 for none)

Reply, take: {granted, remaining, refill_ms} (micro-tokens given, micro-tokens left, ms until the amount could
be given again: 0 now, -1 never). Return: {credited, dropped, tokens}.

Errors: "QP_BADARG <what>"; every argument is checked before anything is read or written.

Rules: a missing bucket is full (a return to it drops everything and it stays missing); the bucket is written
(with its TTL) only when something was taken or added.
]]

-- @include prelude

if argc ~= 8 then return fail('expected 8 arguments, got ' .. argc) end
if #KEYS ~= 1 then return fail('expected 1 key, got ' .. #KEYS) end
local mode, amount = tonumber(ARGV[1]), tonumber(ARGV[2])
local cap, rate, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local fb, fr, fc = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if not (mode == 1 or mode == 2) then return fail('mode must be 1 (take) or 2 (return)') end
if not int(amount, 1) then return fail('amount must be an integer >= 1') end
if not int(cap, 0) then return fail('capacity must be an integer >= 0') end
if not (rate and rate >= 0 and rate < huge) then return fail('rate must be a finite number >= 0') end
if not int(ttl, 1) then return fail('ttl must be an integer >= 1') end
if not int(fb, 0) then return fail('floor-before must be an integer >= 0') end
if not (fr and fr >= 0 and fr < huge) then return fail('floor rate must be a finite number >= 0') end
if not int(fc, 0) then return fail('floor capacity must be an integer >= 0') end

local key = KEYS[1]
local h = call('HMGET', key, 'tk', 'fr', 'ts', 'rt', 'cp')
if mode == 2 and not h[1] then return { 0, amount, cap } end

local now = clock()
local tokens, carry, ts, ceiling
if not h[1] then
  -- A missing bucket counts as written at time 0, before any floor (token_bucket.lua).
  tokens = cap; carry = 0; ts = now; ceiling = cap
  if fb > 0 and fc < tokens then tokens = fc end
else
  tokens = tonumber(h[1])
  ts = tonumber(h[3])
  local r = min(tonumber(h[4]), rate)
  ceiling = min(tonumber(h[5]), cap)
  if ts < fb then
    r = min(r, fr)
    tokens = min(tokens, fc)
  end
  local gained = max(0, now - ts) * r + tonumber(h[2])
  local w = floor(gained)
  carry = gained - w
  tokens = tokens + w
  if tokens >= ceiling then
    tokens = ceiling; carry = 0
  end
  ts = max(ts, now)
end

if mode == 2 then
  local room = max(0, ceiling - tokens)
  local credited = min(amount, room)
  local dropped = amount - credited
  if credited == 0 then return { 0, dropped, tokens } end
  tokens = tokens + credited
  if tokens >= ceiling then carry = 0 end
  call('HSET', key, 'tk', tokens, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)
  call('PEXPIRE', key, ttl)
  return { credited, dropped, tokens }
end

local granted = min(amount, tokens)
if granted < 0 then granted = 0 end
local remaining = tokens - granted

local refill_ms
if cap <= 0 then
  refill_ms = -1
else
  local target = min(amount, cap)
  if remaining >= target then refill_ms = 0
  elseif rate <= 0 then refill_ms = -1
  else
    local need = target - remaining - carry
    local us = ceil(need / rate)
    if us * rate + carry < target - remaining then us = us + 1 end
    refill_ms = ceil(us / 1000)
  end
end

if granted > 0 then
  call('HSET', key, 'tk', remaining, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)
  call('PEXPIRE', key, ttl)
end
return { granted, remaining, refill_ms }
