--[[
daily_budget.lua: calendar-day budgets. Decide n counters of one slot all-or-nothing on Redis time: each admits a
request when the micro-units used in the current day plus the request's cost stay within its limit.

KEYS
  n hashes, one per counter: fields start (µs start of the day counted) and used (micro-units); then, when flag
  bit 2 is set, the idempotency record (a string "<sha1 of keys and costs>|<reply>") in the same slot.

ARGV
  ARGV[1]  n: number of counters, 1..16
  ARGV[2]  flags: bit 1 dry run (read only), bit 2 idempotency record present (last key)
  ARGV[3]  idempotency record TTL in ms (integer >= 1 when a record is present, else 0)
  ARGV[4]  deadline in µs of Redis time (integer >= 0; 0 = none): a call that starts later decides nothing
  then per counter, 6 values:
    limit   micro-units admitted per day (integer >= 0)
    cost    micro-units (integer >= 1)
    b0..b3  starts of yesterday, today, tomorrow and the day after, µs (ascending integers, computed by the
            agent in the policy's time zone: core/models/daily-budget.ts dayBoundariesMs)

Reply (flat array of integers): {-1} when the deadline passed; {-2} when Redis time is in none of the three days
  (the agent's clock is more than a day off: nothing decided); otherwise allowed (1/0), replayed (0; 1 when the
  record answered with the first decision; 2 when it answers another request: nothing decided), then per counter:
  allowed, remaining micro-units, retry-after ms (0 fits; -1 never can: cost above limit; else until the day
  ends), ms until the day ends, start (µs start of the day charged, 0 when nothing was charged).

Errors: "QP_BADARG <what>" for any malformed argument; every argument is checked before anything is read.

Rules (core/models/daily-budget.ts DailyBudgetModel is the model): the day is the one whose [start, next start) holds
Redis TIME; a counter whose start is another day counts 0 (a new day begins empty); admitted, not dry: every
counter gets {start, used + cost} and expires a minute after its day ends. Denied or dry: nothing is written.
]]

-- @include prelude
-- @include args
-- @include idempotency

local batch, refused = batch_args('counter', 6)
if not batch then return refused end
local n, dry, has_record, record_ttl, deadline = batch.n, batch.dry, batch.has_record, batch.record_ttl, batch.deadline

local limits, costs, bounds = {}, {}, {}
for i = 1, n do
  local a = 4 + 6 * (i - 1)
  local limit, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if not int(limit, 0) then return fail('limit of counter ' .. i .. ' must be an integer >= 0') end
  if not int(cost, 1) then return fail('cost of counter ' .. i .. ' must be an integer >= 1') end
  local b = {}
  for k = 1, 4 do
    b[k] = tonumber(ARGV[a + 2 + k])
    if not int(b[k], 1) or (k > 1 and b[k] <= b[k - 1]) then
      return fail('bounds of counter ' .. i .. ' must be ascending integers >= 1')
    end
  end
  limits[i] = limit; costs[i] = cost; bounds[i] = b
end

local now = clock()
if deadline > 0 and now > deadline then return { -1 } end

local fingerprint
if has_record then
  local parts = {}
  for i = 1, n do parts[i] = KEYS[i] .. ' ' .. ARGV[4 + 6 * (i - 1) + 2] end
  fingerprint = idem_fingerprint(parts)
  local replay = idem_replay(call('GET', KEYS[n + 1]), fingerprint)
  if replay then return replay end
  if replay == false then
    local reply = { 0, 2 }
    for _ = 1, 5 * n do reply[#reply + 1] = 0 end
    return reply
  end
end

local starts, ends, useds, fits = {}, {}, {}, {}
local allowed = true
for i = 1, n do
  local b = bounds[i]
  local w = 0
  for k = 1, 3 do
    if b[k] <= now and now < b[k + 1] then w = k end
  end
  if w == 0 then return { -2 } end
  local stored = call('HMGET', KEYS[i], 'start', 'used')
  local used = 0
  if stored[1] and tonumber(stored[1]) == b[w] then used = tonumber(stored[2]) or 0 end
  starts[i] = b[w]; ends[i] = b[w + 1]; useds[i] = used
  fits[i] = used + costs[i] <= limits[i]
  if not fits[i] then allowed = false end
end

local reply = { allowed and 1 or 0, 0 }
local write = allowed and not dry
for i = 1, n do
  local reset = ceil((ends[i] - now) / 1000)
  local retry = 0
  if not fits[i] then
    if costs[i] > limits[i] then retry = -1 else retry = reset end
  end
  if write then
    call('HSET', KEYS[i], 'start', fmt('%d', starts[i]), 'used', fmt('%d', useds[i] + costs[i]))
    call('PEXPIRE', KEYS[i], reset + 60000)
  end
  local remaining = limits[i] - useds[i]
  if allowed then remaining = remaining - costs[i] end
  reply[#reply + 1] = allowed and 1 or 0
  reply[#reply + 1] = max(0, remaining)
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
  reply[#reply + 1] = write and starts[i] or 0
end

-- Only admissions are remembered: a refusal wrote nothing, so a retry is decided afresh.
if has_record and write then idem_save(KEYS[n + 1], fingerprint, reply, 1, #reply, '%d', record_ttl) end

return reply
