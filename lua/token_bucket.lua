--[[
token_bucket.lua: decide token buckets on Redis time. One call carries G requests; each request decides its
buckets all-or-nothing, and requests run one after another, exactly as G separate calls at the same instant
would (the store batches concurrent callers into one call to spare round trips and script overhead).

KEYS (per request, in order)
  n bucket hashes (fields: tk micro-tokens, fr carry in [0,1) micro-token, ts last update in microseconds of
  Redis TIME, rt refill rate in force in tokens per second, cp capacity in force in micro-tokens), then, when
  its idempotency TTL is > 0, the request's idempotency record (a string) and its subject's record index (a
  sorted set: record keys scored by expiry in ms of Redis time). On a cluster all keys of one call share a slot
  (the record keys an index names share its slot too: they carry the same hash tag).

ARGV
  ARGV[1]      G: number of requests, 1..256
  ARGV[2]      deadline in microseconds of Redis TIME (integer >= 0; 0 = none): a call that runs later than
               this changes nothing and replies {-1}. The caller has answered "unavailable" by then, so a call
               that waited in a frozen or slow Redis must not charge anyone.
  then per request:
    n          number of buckets, 1..16
    flags      bit 1 (value 1): dry run, decide without consuming or writing anything
               bit 2 (value 2): every bucket of the request carries the three floor values below
               bit 3 (value 4): some buckets must already exist (a subject-creation cap); `guard` follows
    idem_ttl   idempotency record TTL in milliseconds; 0 when the request has no idempotency key
    idem_max   only when idem_ttl > 0: most live records the subject's index keeps (integer >= 1); writing one
               more deletes those closest to expiry
    guard      only with flag 4: bitmask of the buckets that must exist (bit i - 1 for bucket i; 1..2^n - 1).
               When one of them is missing, the request decides and writes nothing (see the reply)
    then per bucket, 4 values (7 with flag 2):
      capacity        micro-tokens (integer >= 0)
      rate            refill, tokens per second (= micro-tokens per microsecond; >= 0)
      cost            micro-tokens (integer >= 1)
      ttl             idle TTL in milliseconds (integer >= 1); must cover a refill from empty
      floor_before    microseconds of Redis time (integer >= 0; 0 = no floor)
      floor_rate      tokens per second (>= 0): the most a bucket last written before floor_before refills at
      floor_capacity  micro-tokens (integer >= 0): stored tokens of such a bucket are clamped to it first, and a
                      missing bucket starts with at most it (it counts as written at time 0)

Reply (flat array of integers): {-1} when the deadline passed; otherwise, per request:
  allowed (1 when every bucket had room and all were charged; none charged otherwise), replayed (1 when the
  idempotency record answered with the first decision; 2 when the record belongs to a different request, i.e.
  other bucket keys or costs: a conflict, nothing decided or charged; 3 when a bucket that must exist is missing:
  nothing decided or charged, and each bucket's values are {1 when it is such a missing bucket else 0, 0, 0, 0}),
  then per bucket: allowed (1/0), remaining micro-tokens, retry-after ms (0 fits, -1 never can), ms until full
  (-1 never).

Errors: "QP_BADARG <what>" for any malformed argument; every argument of every request is checked before
anything is read or written.

Rules (the reference model in core/models/token-bucket.ts follows them operation for operation):
  - refill and clamp as lua/include/refill.lua states them (shared with lend.lua, credit.lua and grant.lua):
    nothing is minted by a rate change, a capacity change, or a clock step backwards.
  - a missing (expired) bucket is full: never more than full, nor than the floor capacity; unless it must exist (flag 4), when the request is
    answered 3 and nothing is written, so only the caller's creation step makes new buckets.
  - dry runs write nothing; other requests write every bucket (refilled, and charged when allowed) and its TTL.
]]

-- @include prelude
-- @include refill
-- @include idempotency
local ARGV = ARGV
local KEYS = KEYS

-- An integer below 2^53 as the digits Redis would write for it (%.17g), formatted as an integer: the same string
-- at a fraction of the cost. Any other number is returned as it is, for Redis to convert.
local function digits(v)
  if v % 1 == 0 and v > -9e15 and v < 9e15 then return fmt('%d', v) end
  return v
end

-- The slow path: say exactly what is wrong with ARGV[i].
local function badarg(i, what, lo, integer)
  local v = tonumber(ARGV[i])
  local why
  if v == nil or v ~= v or v == huge or v == -huge then why = ' is not a finite number'
  elseif v < lo then why = ' must be >= ' .. lo
  elseif integer and v % 1 ~= 0 then why = ' must be an integer'
  else why = ' is out of range' end
  return fail(what .. why)
end

-- Parse and check every argument first, inline (this runs for every bucket of every request): a malformed call
-- changes nothing. A value passes when it is finite, >= its lower bound and, where required, an integer;
-- NaN fails every comparison.
local g = tonumber(ARGV[1])
if not (g and g >= 1 and g < huge and g % 1 == 0) then return badarg(1, 'request count', 1, true) end
if g > 256 then return fail('request count must be <= 256') end
local deadline = tonumber(ARGV[2])
if not (deadline and deadline >= 0 and deadline < huge and deadline % 1 == 0) then
  return badarg(2, 'deadline', 0, true)
end

-- Per request (index r): first bucket index, bucket count, dry, idempotency TTL, idempotency key index, most
-- records per subject.
local q_first, q_n, q_dry, q_ttl, q_idem, q_max, q_guard = {}, {}, {}, {}, {}, {}, {}
-- Per bucket (index j, across requests): key index and parameters.
local b_key, b_cap, b_rate, b_cost, b_ttl, b_fb, b_fr, b_fc, b_cost_arg = {}, {}, {}, {}, {}, {}, {}, {}, {}
local a = 2
local k = 0
-- The requests of one call mostly share their parameters: each distinct ARGV string is converted once, and each
-- distinct TTL formatted once for PEXPIRE.
local nums, ttls = {}, {}
local j = 0
for r = 1, g do
  local n, flags, ttl = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if not (n and n >= 1 and n < huge and n % 1 == 0) then return badarg(a + 1, 'bucket count', 1, true) end
  if n > 16 then return fail('bucket count must be <= 16') end
  if not (flags and flags >= 0 and flags <= 7 and flags % 1 == 0) then
    if flags and flags == flags and flags % 1 == 0 and flags > 7 then return fail('flags must be 0..7') end
    return badarg(a + 2, 'flags', 0, true)
  end
  if not (ttl and ttl >= 0 and ttl < huge and ttl % 1 == 0) then return badarg(a + 3, 'idempotency TTL', 0, true) end
  local width = 4
  if flags % 4 >= 2 then width = 7 end
  a = a + 3
  if ttl > 0 then
    local most = tonumber(ARGV[a + 1])
    if not (most and most >= 1 and most < huge and most % 1 == 0) then return badarg(a + 1, 'records per subject', 1, true) end
    q_max[r] = most
    a = a + 1
  end
  q_guard[r] = 0
  if flags >= 4 then
    local guard = tonumber(ARGV[a + 1])
    if not (guard and guard >= 1 and guard < huge and guard % 1 == 0) then return badarg(a + 1, 'guard', 1, true) end
    if guard >= 2 ^ n then return fail('guard must be < 2^' .. n) end
    q_guard[r] = guard
    a = a + 1
  end
  if a + width * n > argc then return fail('expected ' .. (a + width * n) .. ' arguments, got ' .. argc) end
  q_first[r] = j + 1; q_n[r] = n; q_dry[r] = flags % 2 == 1; q_ttl[r] = ttl
  for i = 1, n do
    local s1, s2, s3, s4 = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
    local cap, rate, cost, bttl = nums[s1], nums[s2], nums[s3], nums[s4]
    if not cap then cap = tonumber(s1); nums[s1] = cap end
    if not rate then rate = tonumber(s2); nums[s2] = rate end
    if not cost then cost = tonumber(s3); nums[s3] = cost end
    if not bttl then bttl = tonumber(s4); nums[s4] = bttl end
    if not (cap and cap >= 0 and cap < huge and cap % 1 == 0) then return badarg(a + 1, 'capacity', 0, true) end
    if not (rate and rate >= 0 and rate < huge) then return badarg(a + 2, 'rate', 0, false) end
    if not (cost and cost >= 1 and cost < huge and cost % 1 == 0) then return badarg(a + 3, 'cost', 1, true) end
    if not (bttl and bttl >= 1 and bttl < huge and bttl % 1 == 0) then return badarg(a + 4, 'ttl', 1, true) end
    local fb, fr, fc = 0, 0, 0
    if width == 7 then
      fb, fr, fc = tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
      if not (fb and fb >= 0 and fb < huge and fb % 1 == 0) then return badarg(a + 5, 'floor-before', 0, true) end
      if not (fr and fr >= 0 and fr < huge) then return badarg(a + 6, 'floor rate', 0, false) end
      if not (fc and fc >= 0 and fc < huge and fc % 1 == 0) then return badarg(a + 7, 'floor capacity', 0, true) end
    end
    j = j + 1
    local ttl = ttls[s4]
    if not ttl then ttl = digits(bttl); ttls[s4] = ttl end
    b_key[j] = k + i; b_cap[j] = cap; b_rate[j] = rate; b_cost[j] = cost; b_ttl[j] = ttl
    b_fb[j] = fb; b_fr[j] = fr; b_fc[j] = fc; b_cost_arg[j] = ARGV[a + 3]
    a = a + width
  end
  if ttl > 0 then q_idem[r] = k + n + 1; k = k + n + 2 else q_idem[r] = false; k = k + n end
end
if a ~= argc then return fail('expected ' .. a .. ' arguments, got ' .. argc) end
if k ~= #KEYS then return fail('expected ' .. k .. ' keys, got ' .. #KEYS) end

local now = clock()
if deadline > 0 and now > deadline then return { -1 } end
local reply = {}
local out = 0
local s_tokens, s_carry, s_ts, s_fits, s_same, s_absent = {}, {}, {}, {}, {}, {}

for r = 1, g do
  local first, last, dry, idem = q_first[r], q_first[r] + q_n[r] - 1, q_dry[r], q_idem[r]
  local replay, fingerprint
  if idem then
    local parts = {}
    for b = first, last do parts[#parts + 1] = KEYS[b_key[b]] .. ' ' .. b_cost_arg[b] end
    fingerprint = idem_fingerprint(parts)
    replay = idem_replay(call('GET', KEYS[idem]), fingerprint)
  end
  if replay then
    -- A retry: replay the first decision, marked replayed, and charge nothing.
    for i = 1, #replay do
      out = out + 1
      reply[out] = replay[i]
    end
  elseif replay == false then
    reply[out + 1] = 0
    reply[out + 2] = 2
    out = out + 2
    for b = first, last do
      reply[out + 1] = 0; reply[out + 2] = 0; reply[out + 3] = 0; reply[out + 4] = 0
      out = out + 4
    end
  else
    -- Read every bucket first. A bucket that must exist (a subject-creation cap) and is missing: the request
    -- decides and writes nothing (answered 3), so only the caller's creation step makes it.
    local guard, missing, bit = q_guard[r], false, 1
    local allowed = true
    for b = first, last do
      local cap = b_cap[b]
      local h = call('HMGET', KEYS[b_key[b]], 'tk', 'fr', 'ts', 'rt', 'cp')
      -- fr, rt and cp are read twice (refill, then `same`): converted once.
      if h[1] then h[2], h[4], h[5] = tonumber(h[2]), tonumber(h[4]), tonumber(h[5]) end
      s_absent[b] = not h[1] and guard % (bit * 2) >= bit
      if s_absent[b] then missing = true end
      bit = bit * 2
      local tokens, carry, ts = refill(h, now, cap, b_rate[b], b_fb[b], b_fr[b], b_fc[b])
      -- same: the stored rate and capacity equal the new ones and there is no carry to clear, so a write
      -- needs only tk, ts (and fr when there is a carry): fewer fields to convert and store.
      local same = h[1] and h[4] == b_rate[b] and h[5] == cap and h[2] == 0 or false
      local fits = tokens >= b_cost[b]
      if not fits then allowed = false end
      s_tokens[b] = tokens; s_carry[b] = carry; s_ts[b] = ts; s_fits[b] = fits; s_same[b] = same
    end
    if missing then
      reply[out + 1] = 0
      reply[out + 2] = 3
      out = out + 2
      for b = first, last do
        reply[out + 1] = s_absent[b] and 1 or 0; reply[out + 2] = 0; reply[out + 3] = 0; reply[out + 4] = 0
        out = out + 4
      end
    else
      local start = out
      reply[out + 1] = allowed and 1 or 0
      reply[out + 2] = 0
      out = out + 2
      for b = first, last do
        local cap, rate, cost = b_cap[b], b_rate[b], b_cost[b]
        local tokens, carry, fits = s_tokens[b], s_carry[b], s_fits[b]
        local remaining = tokens
        if allowed then remaining = tokens - cost end
        local retry = 0
        if not fits then
          if cost > cap then retry = -1 else retry = ms(micros_until(tokens, carry, cost, rate)) end
        end
        reply[out + 1] = (fits and allowed) and 1 or 0
        reply[out + 2] = remaining
        reply[out + 3] = retry
        reply[out + 4] = ms(micros_until(remaining, carry, cap, rate))
        out = out + 4
        if not dry then
          -- Numbers reach Redis as exact round-trip decimals (Redis converts Lua numbers with %.17g).
          local key = KEYS[b_key[b]]
          local tk, ts = digits(remaining), digits(s_ts[b])
          if not s_same[b] then
            call('HSET', key, 'tk', tk, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)
          elseif carry == 0 then
            call('HSET', key, 'tk', tk, 'ts', ts)
          else
            call('HSET', key, 'tk', tk, 'ts', ts, 'fr', carry)
          end
          call('PEXPIRE', key, b_ttl[b])
        end
      end

      -- Only admissions are remembered: a refusal charged nothing, so a retry is decided afresh.
      if idem and not dry and allowed then
        idem_save(KEYS[idem], fingerprint, reply, start + 1, out, '%.17g', q_ttl[r])
        -- The subject's index: expired entries dropped, this record added, those closest to expiry deleted past
        -- the most it may keep; the index lives as long as its last record.
        local index, now_ms = KEYS[idem + 1], floor(now / 1000)
        call('ZREMRANGEBYSCORE', index, '-inf', now_ms)
        call('ZADD', index, now_ms + q_ttl[r], KEYS[idem])
        local over = call('ZCARD', index) - q_max[r]
        if over > 0 then
          call('DEL', unpack(call('ZRANGE', index, 0, over - 1)))
          call('ZREMRANGEBYRANK', index, 0, over - 1)
        end
        call('PEXPIRE', index, tonumber(call('ZRANGE', index, -1, -1, 'WITHSCORES')[2]) - now_ms)
      end
    end
  end
end

return reply
