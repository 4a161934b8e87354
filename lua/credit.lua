--[[
credit.lua: add tokens lent by other regions to a subject's bucket in this region (core/borrowing/transfer.ts
is the model, operation for operation). Refills the bucket first, on Redis time, exactly as token_bucket.lua
would, then adds what fits under the lower of the stored and the given capacity; the rest is dropped. So the
bucket never holds more than its share's cap, and a transfer never mints.

KEYS
  KEYS[1]  the subject's bucket hash (fields as in token_bucket.lua)

ARGV
  ARGV[1]  amount granted, micro-tokens (integer >= 1)
  ARGV[2]  capacity in micro-tokens (integer >= 0): this region's share of the burst
  ARGV[3]  refill in tokens per second (>= 0)
  ARGV[4]  idle TTL in milliseconds (integer >= 1)
  ARGV[5]  floor_before, ARGV[6] floor_rate, ARGV[7] floor_capacity: token_bucket.lua's rate-history floor

Reply {credited, dropped, tokens}: micro-tokens added, micro-tokens that found no room, micro-tokens held after.

Errors: "QP_BADARG <what>"; every argument is checked before anything is read or written.

Rules: a missing bucket is full (everything is dropped and it stays missing); the bucket is written (with its
TTL) only when something was added.
]]

-- @include prelude

if argc ~= 7 then return fail('expected 7 arguments, got ' .. argc) end
if #KEYS ~= 1 then return fail('expected 1 key, got ' .. #KEYS) end
local amount, cap, rate, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local fb, fr, fc = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if not int(amount, 1) then return fail('amount must be an integer >= 1') end
if not int(cap, 0) then return fail('capacity must be an integer >= 0') end
if not (rate and rate >= 0 and rate < huge) then return fail('rate must be a finite number >= 0') end
if not int(ttl, 1) then return fail('ttl must be an integer >= 1') end
if not int(fb, 0) then return fail('floor-before must be an integer >= 0') end
if not (fr and fr >= 0 and fr < huge) then return fail('floor rate must be a finite number >= 0') end
if not int(fc, 0) then return fail('floor capacity must be an integer >= 0') end

local key = KEYS[1]
local h = call('HMGET', key, 'tk', 'fr', 'ts', 'rt', 'cp')
if not h[1] then return { 0, amount, cap } end

local now = clock()
local tokens = tonumber(h[1])
local ts = tonumber(h[3])
local r = min(tonumber(h[4]), rate)
local ceiling = min(tonumber(h[5]), cap)
if ts < fb then
  r = min(r, fr)
  tokens = min(tokens, fc)
end
local gained = max(0, now - ts) * r + tonumber(h[2])
local w = floor(gained)
local carry = gained - w
tokens = tokens + w
if tokens >= ceiling then
  tokens = ceiling; carry = 0
end
ts = max(ts, now)

local room = max(0, ceiling - tokens)
local credited = min(amount, room)
local dropped = amount - credited
if credited == 0 then return { 0, dropped, tokens } end
tokens = tokens + credited
if tokens >= ceiling then carry = 0 end
call('HSET', key, 'tk', tokens, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)
call('PEXPIRE', key, ttl)
return { credited, dropped, tokens }
