--[[
refund.lua: give back tokens that a decision charged, when a later part of a layered request (another cluster
slot) denied and the whole request must leave no grant behind. Reads no clock: a refund only adds.

KEYS
  n bucket hashes written by token_bucket.lua (fields tk micro-tokens, fr carry, ts, rt, cp capacity in force in
  micro-tokens), then, when ARGV[2] is 1, the request's idempotency record in the same slot, which is deleted
  so that a retry decides afresh instead of replaying a grant that was taken back.

ARGV
  ARGV[1]  n: number of buckets, 1..16
  ARGV[2]  1 to delete the idempotency record (last key), 0 when there is none
  then per bucket, 2 values:
    cost       micro-tokens charged (integer >= 1): exactly what the decision took
    capacity   micro-tokens (integer >= 0): the capacity the decision was made with
  then, optionally, one more:
    deadline   µs of Redis TIME (integer >= 1): a refund that runs later changes nothing and answers {-1} (a
               client handing back tokens it took ahead gives them back only within their horizon)

Reply (flat array of integers): {-1} when the deadline passed; otherwise per bucket, micro-tokens given back and
micro-tokens held after (-1 when the key is gone: a missing bucket is full, so nothing is given back), then 1 when
the idempotency record was deleted.

Errors: "QP_BADARG <what>" for any malformed argument; every argument is checked before anything is read.

Rules (core/models/refund.ts is the model, operation for operation):
  - the clock is read only when a deadline is given;
  - after = min(tokens + cost, min(stored capacity, capacity)), never below tokens: a refund never takes away,
    never fills past the lower of the capacities, and cannot mint.
  - a missing key is left missing.
  - only tk (and fr, cleared when the bucket is full again) are written; ts, rt, cp and the TTL are untouched.
]]

-- @include prelude

local n = tonumber(ARGV[1])
if not (n and n >= 1 and n <= 16 and n % 1 == 0) then return fail('bucket count must be an integer in 1..16') end
local drop = tonumber(ARGV[2])
if not (drop == 0 or drop == 1) then return fail('record flag must be 0 or 1') end
if argc ~= 2 + 2 * n and argc ~= 3 + 2 * n then
  return fail('expected ' .. (2 + 2 * n) .. ' or ' .. (3 + 2 * n) .. ' arguments, got ' .. argc)
end
if #KEYS ~= n + drop then return fail('expected ' .. (n + drop) .. ' keys, got ' .. #KEYS) end

local costs, caps = {}, {}
for i = 1, n do
  local cost, cap = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  if not (cost and cost >= 1 and cost < huge and cost % 1 == 0) then
    return fail('cost of bucket ' .. i .. ' must be an integer >= 1')
  end
  if not (cap and cap >= 0 and cap < huge and cap % 1 == 0) then
    return fail('capacity of bucket ' .. i .. ' must be an integer >= 0')
  end
  costs[i] = cost
  caps[i] = cap
end
if argc == 3 + 2 * n then
  local deadline = tonumber(ARGV[argc])
  if not int(deadline, 1) then return fail('deadline must be an integer >= 1') end
  if clock() > deadline then return { -1 } end
end

local reply = {}
for i = 1, n do
  local key = KEYS[i]
  local h = call('HMGET', key, 'tk', 'cp')
  if not h[1] then
    reply[2 * i - 1] = 0
    reply[2 * i] = -1
  else
    local tokens = tonumber(h[1])
    local ceiling = caps[i]
    if h[2] then ceiling = min(tonumber(h[2]), ceiling) end
    local after = min(tokens + costs[i], ceiling)
    if after < tokens then after = tokens end
    local given = after - tokens
    if given > 0 then
      if after >= ceiling then
        call('HSET', key, 'tk', after, 'fr', 0)
      else
        call('HSET', key, 'tk', after)
      end
    end
    reply[2 * i - 1] = given
    reply[2 * i] = after
  end
end
local deleted = 0
if drop == 1 then deleted = call('DEL', KEYS[n + 1]) end
reply[2 * n + 1] = deleted
return reply
