--[[
subject_creation.lua: take one creation of a policy's subject-creation cap for one subject's bucket, on Redis
time, idempotent per subject: a subject whose creation is already in the window costs nothing again.

KEYS
  KEYS[1]  the policy's creation log (`rl:new-subjects:{#policy}`, a slot of its own on a cluster): a sorted set,
           one member per creation, member = the subject's bucket key, score = µs of Redis time it was taken.

ARGV
  ARGV[1]  limit: creations in any rolling window (integer >= 1)
  ARGV[2]  window in µs (integer >= 1)
  ARGV[3]  TTL of the log in ms after a creation (integer >= window / 1000)
  ARGV[4]  flags: bit 1 dry run (read only)
  ARGV[5]  deadline in µs of Redis time (integer >= 0; 0 = none): a call that starts later decides nothing
  ARGV[6]  member: the bucket key of the subject to create (non-empty)

Reply (flat array of integers): {-1} when the deadline passed; otherwise outcome, remaining creations, retry-after
  ms. Outcome: 1 taken now (counted), 2 this member already holds a creation within the window (nothing counted:
  a racing first decision of the same subject, in this agent or another on the same Redis), 0 the cap is used
  up. Retry-after is 0 unless the outcome is 0: then the ms until a creation leaves the window.

Errors: "QP_BADARG <what>" for any malformed argument; every argument is checked before anything is read.

Rules (CreationLogModel in core/models/subject-creation.ts is the model, operation for operation):
  - t = max(Redis time, newest score in the log): stamps never move backwards.
  - an entry stamped s counts while t - window < s; it leaves at exactly s + window.
  - the member's own entry in the window: outcome 2, nothing written.
  - otherwise a creation fits when count + 1 <= limit; retry-after is when the (count + 1 - limit)-th oldest
    entry leaves.
  - taken, not dry: the log is trimmed of what left the window, the member is added (or its old score replaced)
    at t, the log gets its TTL. Refused, not dry: trimmed only. Dry: nothing is written. So the log never holds
    more than limit members after a write: the cap's memory is bounded by the cap.
]]

-- @include prelude
-- @include args
local ARGV = ARGV
local KEYS = KEYS

local bad = arity(6, 1)
if bad then return bad end
local limit, window, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not int(limit, 1) then return fail('limit must be an integer >= 1') end
if not int(window, 1) then return fail('window must be an integer >= 1') end
if not (int(ttl, 1) and ttl * 1000 >= window) then return fail('ttl must be an integer >= window') end
local flags = tonumber(ARGV[4])
if not (flags == 0 or flags == 1) then return fail('flags must be 0..1') end
local dry = flags == 1
local deadline = tonumber(ARGV[5])
if not int(deadline, 0) then return fail('deadline must be an integer >= 0') end
local member = ARGV[6]
if member == '' then return fail('member must not be empty') end

local now = clock()
if deadline > 0 and now > deadline then return { -1 } end

local key = KEYS[1]
local t = now
local newest = call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
if newest[1] then
  local score = tonumber(newest[2])
  if score > t then t = score end
end
local lower = t - window
local count = call('ZCOUNT', key, '(' .. fmt('%d', lower), '+inf')
local mine = call('ZSCORE', key, member)
if mine and tonumber(mine) > lower then
  -- Already created within the window: this subject costs no second creation.
  return { 2, math.max(0, limit - count), 0 }
end
local fits = count + 1 <= limit
local retry = 0
if not fits then
  local e = call('ZRANGEBYSCORE', key, '(' .. fmt('%d', lower), '+inf', 'WITHSCORES', 'LIMIT', count - limit, 1)
  retry = ceil((tonumber(e[2]) + window - t) / 1000)
end
if not dry then
  call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', lower))
  if fits then
    call('ZADD', key, t, member)
    call('PEXPIRE', key, ttl)
  end
end
if fits then return { 1, limit - count - 1, 0 } end
return { 0, 0, retry }
