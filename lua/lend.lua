--[[
lend.lua: give some of a subject's tokens in this region to a borrowing region (core/models/transfer.ts is
the model, operation for operation). Refills the bucket first, on Redis time, exactly as token_bucket.lua would,
then takes what is given away. Never takes more than asked, never below zero, never mints.

KEYS
  KEYS[1]  the subject's bucket hash (fields as in token_bucket.lua: tk micro-tokens, fr carry, ts µs, rt
           tokens/s, cp micro-tokens)

ARGV
  ARGV[1]  mode: 1 fill (give min(amount, stock)), 2 spend (charge exactly amount when it fits, else nothing),
           3 spare (a top-up: give min(amount, stock - floor(capacity / 2)), keeping half the burst here)
  ARGV[2]  amount in micro-tokens (integer >= 1)
  ARGV[3]  deadline in microseconds of Redis TIME (integer >= 0; 0 = none): a lend that runs later changes
           nothing and replies {-1} (the borrower stopped waiting; its tokens would be lost)
  ARGV[4]  capacity in micro-tokens (integer >= 0): this region's share of the burst
  ARGV[5]  refill in tokens per second (>= 0): this region's share of the rate
  ARGV[6]  idle TTL in milliseconds (integer >= 1)
  ARGV[7]  floor_before, ARGV[8] floor_rate, ARGV[9] floor_capacity: the rate-history floor of token_bucket.lua
           (0 0 0 for none)

Reply {granted, remaining, refill_ms}: micro-tokens given (spend: charged for the borrower's request, or 0),
micro-tokens left, ms until the bucket could give the amount again (0 now, -1 never: no capacity, no refill, or
a spend above the capacity).

Errors: "QP_BADARG <what>"; every argument is checked before anything is read or written.

Rules: a missing bucket is full; the bucket is written (with its TTL) only when something was given.
]]

-- @include prelude
-- @include args
-- @include refill
-- @include take

local bad = arity(9, 1)
if bad then return bad end
local mode, amount, deadline = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not (mode == 1 or mode == 2 or mode == 3) then return fail('mode must be 1 (fill), 2 (spend) or 3 (spare)') end
if not int(amount, 1) then return fail('amount must be an integer >= 1') end
if not int(deadline, 0) then return fail('deadline must be an integer >= 0') end
local b, refused = bucket_args(4)
if not b then return refused end
local cap, rate = b.cap, b.rate

local now = clock()
if deadline > 0 and now > deadline then return { -1 } end

local key = KEYS[1]
local h = call('HMGET', key, 'tk', 'fr', 'ts', 'rt', 'cp')
local tokens, carry, ts = refill(h, now, cap, rate, b.fb, b.fr, b.fc)

local granted
if mode == 2 then
  if tokens >= amount then granted = amount else granted = 0 end
elseif mode == 3 then
  granted = min(amount, max(0, tokens - floor(cap / 2)))
else
  granted = min(amount, tokens)
end
-- A spend above the capacity can never be charged.
local given, remaining, refill_ms = take_tokens(key, b, tokens, carry, ts, granted, amount, mode == 2 and amount > cap)
return { given, remaining, refill_ms }
