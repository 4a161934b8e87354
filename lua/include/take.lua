-- Tokens given out of a bucket (`-- @include take`, after the prelude and refill): grant.lua's take and lend.lua
-- give `granted` of a bucket just refilled to `tokens`, `carry`, `ts`, and write what is left back.

-- Give `granted` micro-tokens (below 0: none) of the bucket at `key` (parameters `b` from bucket_args), refilled to
-- tokens, carry, ts; the bucket is written (with its TTL) only when something was given. `never`: the amount can
-- never be given (as with a capacity of 0). Returns granted, the micro-tokens left, and the ms until the bucket
-- could give min(amount, capacity) again (0 now, -1 never).
local function take_tokens(key, b, tokens, carry, ts, granted, amount, never)
  local cap, rate = b.cap, b.rate
  if granted < 0 then granted = 0 end
  local remaining = tokens - granted

  local refill_ms
  if cap <= 0 or never then
    refill_ms = -1
  else
    refill_ms = ms(micros_until(remaining, carry, min(amount, cap), rate))
  end

  if granted > 0 then
    call('HSET', key, 'tk', remaining, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)
    call('PEXPIRE', key, b.ttl)
  end
  return granted, remaining, refill_ms
end
