--[[
sliding_log_refund.lua: take back the entries an admitted sliding_log.lua call wrote, when a later part of a
layered request (another cluster slot, or another kind) denied and the whole request must leave no grant behind.
Reads no clock: a refund only removes the members it names.

KEYS
  n sorted sets written by sliding_log.lua, then, when ARGV[2] is 1, the call's idempotency record in the same
  slot, deleted so that a retry decides afresh instead of replaying a grant that was taken back.

ARGV
  ARGV[1]  n: number of logs, 1..16
  ARGV[2]  1 to delete the idempotency record (last key), 0 when there is none
  then per log, 3 values:
    stamp  µs score of the entries written (integer in 1..2^53-1), as the decision replied
    seq    sequence of the first entry written (integer in 0..2^53-100001)
    cost   entries written (integer in 1..100000, MAX_LOG_LIMIT, which bounds the removal loop): members "<stamp>:<seq..seq+cost-1>" (seq zero-padded to 9 digits)

Reply (flat array of integers): per log, members removed (0 when the key or the entries are gone), then 1 when
the idempotency record was deleted.

Errors: "QP_BADARG <what>" for any malformed argument; every argument is checked before anything is written.

Rules (core/models/sliding-log.ts SlidingLogModel.refund is the model): only the named members go; TTLs are untouched.
The names are entry names ("<digits>:<digits>"), so the log's high-water mark (score -inf, "~<stamp>:<seq>", see
sliding_log.lua) is never one of them: it stays until the key expires, so the log never issues a released entry's
name again and a retried release of the same lease removes nothing. A log with neither entries nor mark (written
before the mark existed) disappears when emptied (Redis drops empty sorted sets).
]]

-- @include prelude

local n = tonumber(ARGV[1])
if not (int(n, 1) and n <= 16) then return fail('log count must be an integer in 1..16') end
local drop = tonumber(ARGV[2])
if not (drop == 0 or drop == 1) then return fail('record flag must be 0 or 1') end
if #ARGV ~= 2 + 3 * n then return fail('expected ' .. (2 + 3 * n) .. ' arguments, got ' .. #ARGV) end
if #KEYS ~= n + drop then return fail('expected ' .. (n + drop) .. ' keys, got ' .. #KEYS) end

local stamps, seqs, costs = {}, {}, {}
for i = 1, n do
  local stamp, seq, cost = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  if not (int(stamp, 1) and stamp <= 9007199254740991) then return fail('stamp of log ' .. i .. ' must be an integer in 1..2^53-1') end
  if not (int(seq, 0) and seq <= 9007199254740991 - 100000) then return fail('seq of log ' .. i .. ' must be an integer in 0..2^53-100001') end
  -- Bounds the loop below: a log never holds more than MAX_LOG_LIMIT (core/policy/limits.ts) entries.
  if not (int(cost, 1) and cost <= 100000) then return fail('cost of log ' .. i .. ' must be an integer in 1..100000') end
  stamps[i] = stamp; seqs[i] = seq; costs[i] = cost
end

local reply = {}
for i = 1, n do
  local removed = 0
  local k = 0
  while k < costs[i] do
    local members = {}
    local last = math.min(costs[i], k + 500) - 1
    for m = k, last do members[#members + 1] = fmt('%d:%09d', stamps[i], seqs[i] + m) end
    removed = removed + call('ZREM', KEYS[i], unpack(members))
    k = last + 1
  end
  reply[i] = removed
end
local deleted = 0
if drop == 1 then deleted = call('DEL', KEYS[n + 1]) end
reply[n + 1] = deleted
return reply
