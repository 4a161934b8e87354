--[[
reservation_settle.lua: settle a reservation once: commit what was used, cancel, or expire it (the sweep). The
state moves from reserved exactly once, here, so a commit, a cancel and the sweep racing each other leave exactly
one of them to refund.

KEYS
  KEYS[1]  the reservation's hash, rl:resv:{<id>} (lua/reservation_create.lua)

ARGV
  ARGV[1]  action: commit | cancel | expire
  ARGV[2]  committed amount in micro-units (integer >= 0; commit only, else 0)
  ARGV[3]  retention in ms (integer >= 1): a settled record is kept this long to answer repeats

Reply (array of strings):
  {"missing"}                                         no such record
  {"not_due"}                                         expire before the expiry: nothing changed
  {"above", reserved}                                 commit above the amount reserved: nothing changed
  {"settled", state, reserved, committed, body}       this call settled it: refund reserved - committed
  {"expired", reserved, body}                         commit or cancel at or after the expiry: this call expired
                                                      it (refund it whole) and the caller is told
  {"replay", state, reserved, committed}              the same commit (same amount) or cancel again
  {"conflict", state, reserved, committed}            settled otherwise before (or expire of a settled one)
Errors: "QP_BADARG <what>".

Rules (core/models/reservation.ts ReservationModel is the model): the expiry is Redis TIME >= expires; settling keeps
the record for the retention so repeats answer the same.
]]

-- @include prelude
local action = ARGV[1]
if #KEYS ~= 1 then return fail('expected 1 key') end
if not (action == 'commit' or action == 'cancel' or action == 'expire') then
  return fail('action must be commit, cancel or expire')
end
local amount, retention = tonumber(ARGV[2]), tonumber(ARGV[3])
if not int(amount, 0) then return fail('amount must be an integer >= 0') end
if not int(retention, 1) then return fail('retention must be an integer >= 1') end

local key = KEYS[1]
local f = call('HMGET', key, 'state', 'reserved', 'committed', 'expires', 'body')
local state, reserved, committed, expires, body = f[1], f[2], f[3], f[4], f[5]
if not state then return { 'missing' } end

if state == 'reserved' then
  local expired = clock() >= tonumber(expires)
  if action == 'expire' and not expired then return { 'not_due' } end
  if expired then
    call('HSET', key, 'state', 'expired')
    call('PEXPIRE', key, retention)
    if action == 'expire' then return { 'settled', 'expired', reserved, '0', body } end
    return { 'expired', reserved, body }
  end
  if action == 'commit' then
    if amount > tonumber(reserved) then return { 'above', reserved } end
    state = 'committed'
    committed = string.format('%d', amount)
  else
    state = 'cancelled'
  end
  call('HSET', key, 'state', state, 'committed', committed)
  call('PEXPIRE', key, retention)
  return { 'settled', state, reserved, committed, body }
end

if (state == 'committed' and action == 'commit' and tonumber(committed) == amount)
  or (state == 'cancelled' and action == 'cancel') then
  return { 'replay', state, reserved, committed }
end
return { 'conflict', state, reserved, committed }
