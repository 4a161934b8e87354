--[[
grant.lua: a client's local grant of a subject's tokens (core/models/grant.ts is the model, operation for operation).
Mode 1 (take) refills the bucket on Redis time, exactly as token_bucket.lua would, then takes min(amount, stock):
the tokens leave the bucket before the client spends them, as a lend between regions does (lend.lua, fill).
Mode 2 (return) hands back what the client did not spend: refill, then add what fits under the lower of the
stored and the given capacity (credit.lua); the rest is dropped. Never below zero, never minted.
A return is bound to its take: a take that gives tokens records them (KEYS[2], fields k the bucket's key, a the
micro-tokens granted) for the record TTL; a return credits at most the recorded amount and deletes the record,
so a second return, an unknown or expired id, or another bucket's record credits nothing.

KEYS
  KEYS[1]  the subject's bucket hash (fields as in token_bucket.lua: tk micro-tokens, fr carry, ts µs, rt
           tokens/s, cp micro-tokens)
  KEYS[2]  the grant's record hash (core/keys.ts grantRecordKey: same hash tag as KEYS[1])

ARGV
  ARGV[1]  mode: 1 take, 2 return
  ARGV[2]  amount in micro-tokens (integer >= 1)
  ARGV[3]  capacity in micro-tokens (integer >= 0): this region's share of the burst
  ARGV[4]  refill in tokens per second (>= 0)
  ARGV[5]  idle TTL in milliseconds (integer >= 1)
  ARGV[6]  floor_before, ARGV[7] floor_rate, ARGV[8] floor_capacity: token_bucket.lua's rate-history floor
           (0 0 0 for none)
  ARGV[9]  the grant record's TTL in milliseconds (integer >= 1)

Reply, take: {granted, remaining, refill_ms} (micro-tokens given, micro-tokens left, ms until the amount could
be given again: 0 now, -1 never). Return: {credited, dropped, tokens, known} (dropped: the amount handed back
less what was credited; known 0 for an unknown grant, then credited 0 and tokens 0).

Errors: "QP_BADARG <what>"; every argument is checked before anything is read or written.

Rules: a missing bucket is full (a return to it drops everything and it stays missing); the bucket is written
(with its TTL) only when something was taken or added.
]]

-- @include prelude
-- @include args
-- @include refill

local bad = arity(9, 2)
if bad then return bad end
local mode, amount = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (mode == 1 or mode == 2) then return fail('mode must be 1 (take) or 2 (return)') end
if not int(amount, 1) then return fail('amount must be an integer >= 1') end
local b, refused = bucket_args(3)
if not b then return refused end
local cap, rate, ttl = b.cap, b.rate, b.ttl
local record_ttl = tonumber(ARGV[9])
if not int(record_ttl, 1) then return fail('record ttl must be an integer >= 1') end

local key, record = KEYS[1], KEYS[2]

if mode == 2 then
  local r = call('HMGET', record, 'k', 'a')
  local recorded = tonumber(r[2])
  if r[1] ~= key or not recorded then return { 0, amount, 0, 0 } end
  call('DEL', record)
  local give = min(amount, recorded)
  local h = call('HMGET', key, 'tk', 'fr', 'ts', 'rt', 'cp')
  if not h[1] then return { 0, amount, cap, 1 } end
  local tokens, carry, ts, ceiling = refill(h, clock(), cap, rate, b.fb, b.fr, b.fc)
  local credited, _dropped
  credited, _dropped, tokens, carry = add_tokens(tokens, carry, ceiling, give)
  if credited == 0 then return { 0, amount, tokens, 1 } end
  call('HSET', key, 'tk', tokens, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)
  call('PEXPIRE', key, ttl)
  return { credited, amount - credited, tokens, 1 }
end

local h = call('HMGET', key, 'tk', 'fr', 'ts', 'rt', 'cp')
local tokens, carry, ts, ceiling = refill(h, clock(), cap, rate, b.fb, b.fr, b.fc)

local granted = min(amount, tokens)
if granted < 0 then granted = 0 end
local remaining = tokens - granted

local refill_ms
if cap <= 0 then
  refill_ms = -1
else
  refill_ms = ms(micros_until(remaining, carry, min(amount, cap), rate))
end

if granted > 0 then
  call('HSET', key, 'tk', remaining, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)
  call('PEXPIRE', key, ttl)
  call('HSET', record, 'k', key, 'a', granted)
  call('PEXPIRE', record, record_ttl)
end
return { granted, remaining, refill_ms }
