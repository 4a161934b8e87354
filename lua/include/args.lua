-- Argument checks several scripts share (`-- @include args`, after the prelude): the counts of arguments and
-- keys, a bucket's parameters, and the header of a slot's batch of counters or logs. Each returns the error reply
-- of the first argument it refuses, so a malformed call changes nothing.

-- nil when the call carries `args` arguments and `keys` keys; else the refusal.
local function arity(args, keys)
  if argc ~= args then return fail('expected ' .. args .. ' arguments, got ' .. argc) end
  if #KEYS ~= keys then return fail('expected ' .. keys .. (keys == 1 and ' key' or ' keys') .. ', got ' .. #KEYS) end
end

-- A bucket's parameters from ARGV[i] on (token_bucket.lua's): capacity in micro-tokens, refill in tokens per
-- second, idle TTL in ms, then the rate-history floor (floor_before µs, floor_rate tokens/s, floor_capacity
-- micro-tokens; 0 0 0 for none). Returns them as a table, or nil and the refusal.
local function bucket_args(i)
  local cap, rate, ttl = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local fb, fr, fc = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
  if not int(cap, 0) then return nil, fail('capacity must be an integer >= 0') end
  if not (rate and rate >= 0 and rate < huge) then return nil, fail('rate must be a finite number >= 0') end
  if not int(ttl, 1) then return nil, fail('ttl must be an integer >= 1') end
  if not int(fb, 0) then return nil, fail('floor-before must be an integer >= 0') end
  if not (fr and fr >= 0 and fr < huge) then return nil, fail('floor rate must be a finite number >= 0') end
  if not int(fc, 0) then return nil, fail('floor capacity must be an integer >= 0') end
  return { cap = cap, rate = rate, ttl = ttl, fb = fb, fr = fr, fc = fc }
end

-- The header of a batch of n counters (noun 'counter') or logs ('log') of one slot, `width` values each:
--   ARGV[1] n (1..16), ARGV[2] flags (bit 1 dry run, bit 2 idempotency record present as the last key),
--   ARGV[3] record TTL in ms (>= 1 with a record, else >= 0), ARGV[4] deadline in µs of Redis time (0 = none).
-- Returns {n, dry, has_record, record_ttl, deadline}, or nil and the refusal.
local function batch_args(noun, width)
  local n = tonumber(ARGV[1])
  if not (int(n, 1) and n <= 16) then return nil, fail(noun .. ' count must be an integer in 1..16') end
  local flags = tonumber(ARGV[2])
  if not (flags == 0 or flags == 1 or flags == 2 or flags == 3) then return nil, fail('flags must be 0..3') end
  local has_record = flags >= 2
  local record_ttl = tonumber(ARGV[3])
  if not int(record_ttl, 0) then return nil, fail('idempotency TTL must be an integer >= 0') end
  if has_record and record_ttl < 1 then return nil, fail('idempotency TTL must be >= 1 with a record') end
  local deadline = tonumber(ARGV[4])
  if not int(deadline, 0) then return nil, fail('deadline must be an integer >= 0') end
  local bad = arity(4 + width * n, has_record and n + 1 or n)
  if bad then return nil, bad end
  return { n = n, dry = flags % 2 == 1, has_record = has_record, record_ttl = record_ttl, deadline = deadline }
end
