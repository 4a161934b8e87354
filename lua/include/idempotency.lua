-- Idempotency records several scripts share (`-- @include idempotency`, after the prelude). A record is a string
-- "<fingerprint>|<reply fields, comma-separated>": the fingerprint (sha1 of the request's keys and costs) names
-- the request it answers, so a key reused for another request is a conflict rather than a wrong replay. Only
-- admissions are remembered: a refusal charged nothing, so a retry is decided afresh.

-- The fingerprint of a request from its parts ("<key> <cost>" each, in order).
local function idem_fingerprint(parts)
  return redis.sha1hex(table.concat(parts, '\n'))
end

-- What `record` (nil when there is none) says for the request fingerprinted `fingerprint`: nil, no record (decide);
-- the first decision's fields with replayed (field 2) set to 1, a retry; false, it answers another request. A value
-- with no bar is a several-group request's claim of the key ("claim:<its fingerprint>", written by the agent with
-- SET NX GET: regional-agent/decisions/idempotency-claim.ts), another request too.
local function idem_replay(record, fingerprint)
  if not record then return nil end
  local bar = string.find(record, '|', 1, true)
  if not (bar and string.sub(record, 1, bar - 1) == fingerprint) then return false end
  local fields = {}
  for field in string.gmatch(string.sub(record, bar + 1), '[^,]+') do fields[#fields + 1] = tonumber(field) end
  fields[2] = 1
  return fields
end

-- Remember reply[first..last] (each field written with `format`) for `ttl_ms` under `key`.
local function idem_save(key, fingerprint, reply, first, last, format, ttl_ms)
  local parts = {}
  for i = first, last do parts[#parts + 1] = fmt(format, reply[i]) end
  call('SET', key, fingerprint .. '|' .. table.concat(parts, ','), 'PX', ttl_ms)
end
