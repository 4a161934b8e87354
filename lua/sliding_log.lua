--[[
sliding_log.lua: exact rolling windows. Decide n logs of one slot all-or-nothing on Redis time: each log admits a
request when the units it holds within the window plus the request's cost stay within its limit.

KEYS
  n sorted sets, one per log: one member per admitted unit, score = µs of Redis time at admission, member
  "<stamp>:<seq>" (seq zero-padded to 9 digits, so the members of one stamp sort by seq); plus, once the log has
  admitted, one high-water mark of score -inf, member "~<stamp>:<seq>": the last entry name it issued (never an
  entry's name: entries start with a digit); then, when flag bit 2 is set, the idempotency record (a string
  "<sha1 of keys and costs>|<reply>") in the same slot.

ARGV
  ARGV[1]  n: number of logs, 1..16
  ARGV[2]  flags: bit 1 dry run (read only), bit 2 idempotency record present (last key)
  ARGV[3]  idempotency record TTL in ms (integer >= 1 when a record is present, else 0)
  ARGV[4]  deadline in µs of Redis time (integer >= 0; 0 = none): a call that starts later decides nothing
  then per log, 4 values:
    limit    units admitted in any rolling window (integer in 0..100000, MAX_LOG_LIMIT in core/policy/limits.ts: bounds the write loop)
    window   µs (integer >= 1)
    cost     units (integer in 1..100000)
    ttl      key TTL in ms after an admission (integer >= window / 1000)

Reply (flat array of integers): {-1} when the deadline passed; otherwise allowed (1/0), replayed (0; 1 when the
  record answered with the first decision; 2 when the record answers another request: nothing decided), then per
  log: allowed, remaining units, retry-after ms (0 fits, -1 never can: cost above limit), ms until the window is
  empty, stamp (µs score of the entries written, 0 when none), seq of the first entry written.

Errors: "QP_BADARG <what>" for any malformed argument; every argument is checked before anything is read.

Rules (core/models/sliding-log.ts is the model, operation for operation):
  - t = max(Redis time, newest score in the log, high-water stamp): stamps never move backwards, so a clock step
    back neither reopens the window nor reorders entries. seq is 0 on a new stamp; on the newest entry's stamp or
    the mark's it continues after the larger of the two. So an entry name is never issued twice while the key
    lives (TTL >= window), even after the entries that held it were released: a lease token (core/concurrency.ts)
    names its own entries only, and a retried release of it can never take another holder's.
  - every read ignores the mark: counts and lookups start above -inf ('(' bounds), the trim is
    ZREMRANGEBYSCORE (-inf ..., and the newest entry is read by ZREVRANGEBYSCORE +inf (-inf. A log written before
    the mark existed (no mark) is decided on its entries alone, as it was, and gets its mark with the next admission.
  - an entry stamped s counts while t - window < s; it leaves at exactly s + window.
  - a request fits a log when count + cost <= limit; retry-after is when the (count + cost - limit)-th oldest
    entry leaves.
  - admitted, not dry: every log trims what left the window, adds cost members at t, replaces its mark by
    "~<t>:<seq + cost - 1>" and gets its TTL. Denied, not dry: logs are trimmed only (mark and TTL untouched).
    Dry: nothing is written, the mark neither. So a log never holds more than max(limit) entries + 1 mark after a
    write: memory per subject is bounded by the limit. A log whose entries all left the window (or were released)
    keeps its mark until the key expires.
]]

-- @include prelude
-- @include args
-- @include idempotency
local ARGV = ARGV
local KEYS = KEYS

local batch, refused = batch_args('log', 4)
if not batch then return refused end
local n, dry, has_record, record_ttl, deadline = batch.n, batch.dry, batch.has_record, batch.record_ttl, batch.deadline

local limits, windows, costs, ttls = {}, {}, {}, {}
for i = 1, n do
  local a = 4 + 4 * (i - 1)
  local limit, window, cost, ttl = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if not (int(limit, 0) and limit <= 100000) then return fail('limit of log ' .. i .. ' must be an integer in 0..100000') end
  if not int(window, 1) then return fail('window of log ' .. i .. ' must be an integer >= 1') end
  if not (int(cost, 1) and cost <= 100000) then return fail('cost of log ' .. i .. ' must be an integer in 1..100000') end
  if not (int(ttl, 1) and ttl * 1000 >= window) then
    return fail('ttl of log ' .. i .. ' must be an integer >= window')
  end
  limits[i] = limit; windows[i] = window; costs[i] = cost; ttls[i] = ttl
end

local now = clock()
if deadline > 0 and now > deadline then return { -1 } end

local fingerprint
if has_record then
  local parts = {}
  for i = 1, n do parts[i] = KEYS[i] .. ' ' .. ARGV[4 + 4 * (i - 1) + 3] end
  fingerprint = idem_fingerprint(parts)
  local replay = idem_replay(call('GET', KEYS[n + 1]), fingerprint)
  if replay then return replay end
  if replay == false then
    local reply = { 0, 2 }
    for _ = 1, 6 * n do reply[#reply + 1] = 0 end
    return reply
  end
end

local ts, seqs, counts, fits = {}, {}, {}, {}
local allowed = true
for i = 1, n do
  local key = KEYS[i]
  local newest = call('ZREVRANGEBYSCORE', key, '+inf', '(-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  -- The high-water mark: the last (stamp, seq) issued, kept after its entries are gone.
  local mark_stamp, mark_seq
  for _, m in ipairs(call('ZRANGEBYSCORE', key, '-inf', '-inf')) do
    local s, q = string.match(m, '^~(%d+):(%d+)$')
    s, q = tonumber(s), tonumber(q)
    if s and (not mark_stamp or s > mark_stamp or (s == mark_stamp and q > mark_seq)) then
      mark_stamp, mark_seq = s, q
    end
  end
  local t, seq = now, 0
  local score = newest[1] and tonumber(newest[2])
  if score and score > t then t = score end
  if mark_stamp and mark_stamp > t then t = mark_stamp end
  if score == t then seq = tonumber(string.sub(newest[1], string.find(newest[1], ':', 1, true) + 1)) + 1 end
  if mark_stamp == t and mark_seq + 1 > seq then seq = mark_seq + 1 end
  local count = call('ZCOUNT', key, '(' .. fmt('%d', t - windows[i]), '+inf')
  ts[i] = t; seqs[i] = seq; counts[i] = count
  fits[i] = count + costs[i] <= limits[i]
  if not fits[i] then allowed = false end
end

local reply = { allowed and 1 or 0, 0 }
for i = 1, n do
  local key, t, seq, count = KEYS[i], ts[i], seqs[i], counts[i]
  local window, cost, limit = windows[i], costs[i], limits[i]
  local lower = '(' .. fmt('%d', t - window)
  local retry = 0
  if not fits[i] then
    if cost > limit then
      retry = -1
    else
      local e = call('ZRANGEBYSCORE', key, lower, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
      retry = ceil((tonumber(e[2]) + window - t) / 1000)
    end
  end
  local reset = 0
  if allowed then
    reset = ceil(window / 1000)
  elseif count > 0 then
    local e = call('ZREVRANGEBYSCORE', key, '+inf', '(-inf', 'WITHSCORES', 'LIMIT', 0, 1)
    reset = ceil((tonumber(e[2]) + window - t) / 1000)
  end
  local write = allowed and not dry
  if not dry then
    -- '(-inf': the mark (score -inf) is never trimmed.
    call('ZREMRANGEBYSCORE', key, '(-inf', fmt('%d', t - window))
    if write then
      -- In chunks: unpack is bounded by Lua's C stack.
      local k = 0
      while k < cost do
        local args = {}
        local last = math.min(cost, k + 500) - 1
        for m = k, last do
          args[#args + 1] = t
          args[#args + 1] = fmt('%d:%09d', t, seq + m)
        end
        call('ZADD', key, unpack(args))
        k = last + 1
      end
      call('ZREMRANGEBYSCORE', key, '-inf', '-inf')
      call('ZADD', key, '-inf', fmt('~%d:%d', t, seq + cost - 1))
      call('PEXPIRE', key, ttls[i])
    end
  end
  local remaining = limit - count
  if allowed then remaining = remaining - cost end
  reply[#reply + 1] = allowed and 1 or 0
  reply[#reply + 1] = max(0, remaining)
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
  reply[#reply + 1] = write and t or 0
  reply[#reply + 1] = write and seq or 0
end

-- Only admissions are remembered: a refusal wrote no entry, so a retry is decided afresh.
if has_record and allowed and not dry then
  idem_save(KEYS[n + 1], fingerprint, reply, 1, #reply, '%d', record_ttl)
end

return reply
