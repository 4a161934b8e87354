--[[
daily_budget_refund.lua: take back what an admitted daily_budget.lua call charged, when a later part of a layered
request denied (or a reservation settled for less). Reads no clock: it gives back only to the day it names.

KEYS
  n counters written by daily_budget.lua, then, when ARGV[2] is 1, the call's idempotency record (same slot),
  deleted so that a retry decides afresh.

ARGV
  ARGV[1]  n: number of counters, 1..16
  ARGV[2]  1 to delete the idempotency record (last key), 0 when there is none
  then per counter, 2 values:
    start  µs start of the day charged (integer >= 1), as the decision replied
    cost   micro-units to give back (integer >= 1)

Reply (flat array of integers): per counter, micro-units given back (0 when the key is gone or counts another
day; never more than it holds), then 1 when the idempotency record was deleted.

Errors: "QP_BADARG <what>"; every argument is checked before anything is written.
]]

-- @include prelude

local n = tonumber(ARGV[1])
if not (int(n, 1) and n <= 16) then return fail('counter count must be an integer in 1..16') end
local del = tonumber(ARGV[2])
if not (del == 0 or del == 1) then return fail('record flag must be 0 or 1') end
if #ARGV ~= 2 + 2 * n then return fail('expected ' .. (2 + 2 * n) .. ' arguments') end
if #KEYS ~= n + del then return fail('expected ' .. (n + del) .. ' keys') end
local starts, costs = {}, {}
for i = 1, n do
  starts[i] = tonumber(ARGV[2 + 2 * i - 1]); costs[i] = tonumber(ARGV[2 + 2 * i])
  if not int(starts[i], 1) then return fail('start of counter ' .. i .. ' must be an integer >= 1') end
  if not int(costs[i], 1) then return fail('cost of counter ' .. i .. ' must be an integer >= 1') end
end

local reply = {}
for i = 1, n do
  local stored = call('HMGET', KEYS[i], 'start', 'used')
  local back = 0
  if stored[1] and tonumber(stored[1]) == starts[i] then
    local used = tonumber(stored[2]) or 0
    back = math.min(used, costs[i])
    call('HSET', KEYS[i], 'used', fmt('%d', used - back))
  end
  reply[i] = back
end
local deleted = 0
if del == 1 then deleted = call('DEL', KEYS[n + 1]) end
reply[n + 1] = deleted
return reply
