--[[
credit.lua: add tokens lent by other regions to a subject's bucket in this region (core/models/transfer.ts
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
-- @include args
-- @include refill

local bad = arity(7, 1)
if bad then return bad end
local amount = tonumber(ARGV[1])
if not int(amount, 1) then return fail('amount must be an integer >= 1') end
local b, refused = bucket_args(2)
if not b then return refused end

local key = KEYS[1]
local h = call('HMGET', key, 'tk', 'fr', 'ts', 'rt', 'cp')
if not h[1] then return { 0, amount, b.cap } end

local tokens, carry, ts, ceiling = refill(h, clock(), b.cap, b.rate, b.fb, b.fr, b.fc)
local credited, dropped
credited, dropped, tokens, carry = add_tokens(tokens, carry, ceiling, amount)
if credited == 0 then return { 0, dropped, tokens } end
call('HSET', key, 'tk', tokens, 'fr', carry, 'ts', ts, 'rt', b.rate, 'cp', b.cap)
call('PEXPIRE', key, b.ttl)
return { credited, dropped, tokens }
