--[[
grant.lua: a client's local grant of a subject's tokens (core/models/grant.ts is the model, operation for operation).
Mode 1 (take) refills the bucket on Redis time, exactly as token_bucket.lua would, then takes min(amount, stock):
the tokens leave the bucket before the client spends them, as a lend between regions does (lend.lua, fill).
Mode 2 (return) hands back what the client did not spend: refill, then add what fits under the lower of the
stored and the given capacity (credit.lua); the rest is dropped. Never below zero, never minted.
A return is bound to its take: a take that gives tokens records them (KEYS[2], fields k the bucket's key, a the
micro-tokens granted) for the record TTL; a return credits at most the recorded amount and deletes the record,
so a second return, an unknown or expired id, or another bucket's record credits nothing.

One call carries G >= 1 operations (the agent's store coalesces the takes and returns of one event-loop turn,
per cluster slot, into one call). They run one after another at the same instant, exactly as G separate calls
would: a later take of the same bucket sees what an earlier one left, so a batch never takes more than the bucket
holds. Operation i (from 1) has KEYS[2i-1], KEYS[2i] and ARGV[9(i-1)+1 .. 9i], laid out as for G = 1 below.

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

Reply: the operations' replies one after another, flat. Take: {granted, remaining, refill_ms} (micro-tokens given, micro-tokens left, ms until the amount could
be given again: 0 now, -1 never). Return: {credited, dropped, tokens, known} (dropped: the amount handed back
less what was credited; known 0 for an unknown grant, then credited 0 and tokens 0).

Errors: "QP_BADARG <what>"; every argument of every operation is checked before anything is read or written
(the arguments must be 9 per operation and the keys 2 per operation).

Rules: a missing bucket is full (a return to it drops everything and it stays missing); the bucket is written
(with its TTL) only when something was taken or added.
]]

-- @include prelude
-- @include args
-- @include refill
-- @include take

local g = argc / 9
if not (argc >= 9 and argc % 9 == 0) then return fail('expected 9 arguments per operation, got ' .. argc) end
if #KEYS ~= 2 * g then return fail('expected ' .. (2 * g) .. ' keys, got ' .. #KEYS) end

-- Every operation's arguments, checked before anything is read or written.
local ops = {}
for i = 1, g do
  local at = 9 * (i - 1)
  local mode, amount = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  if not (mode == 1 or mode == 2) then return fail('mode must be 1 (take) or 2 (return)') end
  if not int(amount, 1) then return fail('amount must be an integer >= 1') end
  local b, refused = bucket_args(at + 3)
  if not b then return refused end
  local record_ttl = tonumber(ARGV[at + 9])
  if not int(record_ttl, 1) then return fail('record ttl must be an integer >= 1') end
  ops[i] = { mode = mode, amount = amount, b = b, record_ttl = record_ttl, key = KEYS[2 * i - 1], record = KEYS[2 * i] }
end

local now = clock()
local out = {}
local n = 0
local function reply(...)
  for _, v in ipairs({ ... }) do
    n = n + 1
    out[n] = v
  end
end

local function give_back(op)
  local key, record, amount, b = op.key, op.record, op.amount, op.b
  local cap, rate = b.cap, b.rate
  local r = call('HMGET', record, 'k', 'a')
  local recorded = tonumber(r[2])
  if r[1] ~= key or not recorded then return reply(0, amount, 0, 0) end
  call('DEL', record)
  local give = min(amount, recorded)
  local h = call('HMGET', key, 'tk', 'fr', 'ts', 'rt', 'cp')
  if not h[1] then return reply(0, amount, cap, 1) end
  local tokens, carry, ts, ceiling = refill(h, now, cap, rate, b.fb, b.fr, b.fc)
  local credited, _dropped
  credited, _dropped, tokens, carry = add_tokens(tokens, carry, ceiling, give)
  if credited == 0 then return reply(0, amount, tokens, 1) end
  call('HSET', key, 'tk', tokens, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)
  call('PEXPIRE', key, b.ttl)
  return reply(credited, amount - credited, tokens, 1)
end

local function take(op)
  local key, record, amount, b = op.key, op.record, op.amount, op.b
  local cap, rate = b.cap, b.rate
  local h = call('HMGET', key, 'tk', 'fr', 'ts', 'rt', 'cp')
  local tokens, carry, ts, _ceiling = refill(h, now, cap, rate, b.fb, b.fr, b.fc)
  local granted, remaining, refill_ms = take_tokens(key, b, tokens, carry, ts, min(amount, tokens), amount, false)
  if granted > 0 then
    call('HSET', record, 'k', key, 'a', granted)
    call('PEXPIRE', record, op.record_ttl)
  end
  return reply(granted, remaining, refill_ms)
end

for i = 1, g do
  if ops[i].mode == 2 then give_back(ops[i]) else take(ops[i]) end
end
return out
