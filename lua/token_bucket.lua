--[[
token_bucket.lua: decide one or more token buckets all-or-nothing, on Redis time.

KEYS
  KEYS[1..n]   bucket hashes, all in one cluster slot (fields: tk micro-tokens, fr carry in [0,1) micro-token,
               ts last update in microseconds of Redis TIME, rt refill rate in force in tokens per second,
               cp capacity in force in micro-tokens)
  KEYS[n+1]    idempotency record (a string), only when ARGV[3] > 0

ARGV
  ARGV[1]      n: number of buckets, 1..16
  ARGV[2]      dry run: 1 decides without consuming or writing anything, 0 decides and charges
  ARGV[3]      idempotency record TTL in milliseconds; 0 when the call has no idempotency key
  then, for bucket i (base = 3 + 7 * (i - 1)):
  ARGV[base+1] capacity, micro-tokens (integer >= 0)
  ARGV[base+2] refill rate, tokens per second (= micro-tokens per microsecond; >= 0)
  ARGV[base+3] cost, micro-tokens (integer >= 1)
  ARGV[base+4] idle TTL, milliseconds (integer >= 1); must cover a refill from empty
  ARGV[base+5] floor-before, microseconds of Redis time (integer >= 0; 0 = no floor)
  ARGV[base+6] floor rate, tokens per second (>= 0): the most a bucket last written before floor-before refills at
  ARGV[base+7] floor capacity, micro-tokens (integer >= 0): stored tokens of such a bucket are clamped to it first

Reply (array of integers)
  [1] allowed: 1 when every bucket had room and all were charged (none charged otherwise)
  [2] replayed: 1 when the idempotency record answered (the first decision, nothing charged)
  then for bucket i (base = 2 + 4 * (i - 1)):
  [base+1] allowed (1/0)   [base+2] remaining micro-tokens
  [base+3] retry-after ms (0 when it fits, -1 when it never can)   [base+4] ms until full (-1: never)

Errors: "QP_BADARG <what>" for any malformed argument; nothing is read or written before all are checked.

Rules (the reference model in core/token-bucket.ts follows them operation for operation):
  - refill = elapsed * min(stored rate, new rate) + carry, elapsed = max(0, now - ts): a rate change never mints,
    and a clock step backwards refills nothing; ts never moves backwards.
  - tokens are clamped to min(stored capacity, new capacity): a shrink clamps at once, and a grow only makes room
    for refills after it is written, so neither mints.
  - a missing (expired) bucket is full: never more than full.
  - dry runs write nothing; other calls write every bucket (refilled, and charged when allowed) and its TTL.
]]

local function badarg(what)
  return redis.error_reply('QP_BADARG ' .. what)
end

local function num(i, what, min, integer)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return nil, badarg(what .. ' is not a finite number') end
  if v < min then return nil, badarg(what .. ' must be >= ' .. min) end
  if integer and math.floor(v) ~= v then return nil, badarg(what .. ' must be an integer') end
  return v
end

local function fmt(v)
  return string.format('%.17g', v)
end

-- @clock-begin (the test build swaps this block for a clock read from a trailing argument; production
-- decisions use Redis time only)
local argc = #ARGV
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- @clock-end

local n, err = num(1, 'bucket count', 1, true)
if err then return err end
if n > 16 then return badarg('bucket count must be <= 16') end
local dry, err2 = num(2, 'dry run flag', 0, true)
if err2 then return err2 end
if dry > 1 then return badarg('dry run flag must be 0 or 1') end
local idem_ttl, err3 = num(3, 'idempotency TTL', 0, true)
if err3 then return err3 end
local want_keys = n
if idem_ttl > 0 then want_keys = n + 1 end
if #KEYS ~= want_keys then return badarg('expected ' .. want_keys .. ' keys, got ' .. #KEYS) end
if argc ~= 3 + 7 * n then return badarg('expected ' .. (3 + 7 * n) .. ' arguments, got ' .. argc) end

local checks = {}
for i = 1, n do
  local b = 3 + 7 * (i - 1)
  local c = {}
  local e
  c.capacity, e = num(b + 1, 'capacity', 0, true); if e then return e end
  c.rate, e = num(b + 2, 'rate', 0, false); if e then return e end
  c.rate_arg = ARGV[b + 2]
  c.cost, e = num(b + 3, 'cost', 1, true); if e then return e end
  c.ttl, e = num(b + 4, 'ttl', 1, true); if e then return e end
  c.floor_before, e = num(b + 5, 'floor-before', 0, true); if e then return e end
  c.floor_rate, e = num(b + 6, 'floor rate', 0, false); if e then return e end
  c.floor_capacity, e = num(b + 7, 'floor capacity', 0, true); if e then return e end
  checks[i] = c
end

if idem_ttl > 0 then
  local record = redis.call('GET', KEYS[n + 1])
  if record then
    local reply = {}
    for field in string.gmatch(record, '[^,]+') do reply[#reply + 1] = tonumber(field) end
    reply[2] = 1
    return reply
  end
end

local now = clock()

local states = {}
local allowed = true
for i = 1, n do
  local c = checks[i]
  local h = redis.call('HMGET', KEYS[i], 'tk', 'fr', 'ts', 'rt', 'cp')
  local s = {}
  if not h[1] then
    s.tokens = c.capacity; s.carry = 0; s.ts = now
  else
    local tokens = tonumber(h[1])
    local ts = tonumber(h[3])
    local rate = math.min(tonumber(h[4]), c.rate)
    local ceiling = math.min(tonumber(h[5]), c.capacity)
    if c.floor_before > 0 and ts < c.floor_before then
      rate = math.min(rate, c.floor_rate)
      tokens = math.min(tokens, c.floor_capacity)
    end
    local elapsed = math.max(0, now - ts)
    local gained = elapsed * rate + tonumber(h[2])
    local whole = math.floor(gained)
    local carry = gained - whole
    tokens = tokens + whole
    if tokens >= ceiling then
      tokens = ceiling; carry = 0
    end
    s.tokens = tokens; s.carry = carry; s.ts = math.max(ts, now)
  end
  s.fits = s.tokens >= c.cost
  if not s.fits then allowed = false end
  states[i] = s
end

local function micros_until(tokens, carry, target, rate)
  if tokens >= target then return 0 end
  if rate <= 0 then return -1 end
  local need = target - tokens - carry
  local us = math.ceil(need / rate)
  if us * rate + carry < target - tokens then us = us + 1 end
  return us
end

local function ms(us)
  if us < 0 then return -1 end
  return math.ceil(us / 1000)
end

local reply = { allowed and 1 or 0, 0 }
for i = 1, n do
  local c = checks[i]
  local s = states[i]
  local remaining = s.tokens
  if allowed then remaining = s.tokens - c.cost end
  local retry = 0
  if not s.fits then
    if c.cost > c.capacity then retry = -1 else retry = ms(micros_until(s.tokens, s.carry, c.cost, c.rate)) end
  end
  local reset = ms(micros_until(remaining, s.carry, c.capacity, c.rate))
  local b = 2 + 4 * (i - 1)
  reply[b + 1] = (s.fits and allowed) and 1 or 0
  reply[b + 2] = remaining
  reply[b + 3] = retry
  reply[b + 4] = reset
  if dry == 0 then
    redis.call('HSET', KEYS[i], 'tk', fmt(remaining), 'fr', fmt(s.carry), 'ts', fmt(s.ts), 'rt', c.rate_arg,
      'cp', fmt(c.capacity))
    redis.call('PEXPIRE', KEYS[i], c.ttl)
  end
end

if idem_ttl > 0 and dry == 0 then
  local parts = {}
  for i = 1, #reply do parts[i] = fmt(reply[i]) end
  redis.call('SET', KEYS[n + 1], table.concat(parts, ','), 'PX', idem_ttl)
end

return reply
