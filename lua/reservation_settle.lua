--[[
reservation_settle.lua: settle a reservation once: commit what was used, cancel, expire it (the sweep), or abort
it (the agent that made it, when it could not learn whether lua/reservation_create.lua ran). The state moves from
reserved exactly once, here, so a commit, a cancel, the sweep and an abort racing each other leave exactly one of
them to refund.

KEYS
  KEYS[1]  the reservation's hash, rl:resv:{<id>} (lua/reservation_create.lua)

ARGV
  ARGV[1]  action: commit | cancel | expire | abort
  ARGV[2]  commit: the committed amount; abort: the amount the decision charged (what a tombstone records);
           micro-units, integer >= 0 (else 0)
  ARGV[3]  retention in ms (integer >= 1): a settled record (or a tombstone) is kept this long to answer repeats
  ARGV[4]  optional: the attempt (1..64 characters), so that an agent that got no answer can ask again: a call
           that moves the state records it, and the same attempt again (whose earlier answer was lost, so nothing
           was refunded for it) answers as that call did ("settled" or "expired", with the body) and changes nothing

Reply (array of strings):
  {"missing"}                                         no such record (commit, cancel, expire)
  {"not_due"}                                         expire before the expiry: nothing changed
  {"above", reserved}                                 commit above the amount reserved: nothing changed
  {"settled", state, reserved, committed, body}       this call settled it: refund reserved - committed
  {"expired", reserved, body}                         commit or cancel at or after the expiry: this call expired
                                                      it (refund it whole) and the caller is told
  {"tombstoned"}                                      abort of no record: a tombstone (state aborted) now makes a
                                                      late create refuse (QP_EXISTS); the caller refunds what its
                                                      decision charged
  {"replay", state, reserved, committed}              the same commit (same amount), cancel or abort again
  {"conflict", state, reserved, committed}            settled otherwise before (or expire of a settled one)
Errors: "QP_BADARG <what>".

Rules (core/models/reservation.ts ReservationModel is the model): the expiry is Redis TIME >= expires; settling keeps
the record for the retention so repeats answer the same. An abort settles a reserved record as aborted (refund it
whole, due or not) and turns a missing one into a tombstone; an abort that finds it settled otherwise (the sweep
expired it first) refunds nothing.
]]

-- @include prelude
local action = ARGV[1]
if #KEYS ~= 1 then return fail('expected 1 key') end
if not (action == 'commit' or action == 'cancel' or action == 'expire' or action == 'abort') then
  return fail('action must be commit, cancel, expire or abort')
end
local amount, retention = tonumber(ARGV[2]), tonumber(ARGV[3])
if not int(amount, 0) then return fail('amount must be an integer >= 0') end
if not int(retention, 1) then return fail('retention must be an integer >= 1') end
local attempt = false
if argc >= 4 then
  attempt = ARGV[4]
  if #attempt < 1 or #attempt > 64 then return fail('attempt must be 1..64 characters') end
end

local key = KEYS[1]
local f = call('HMGET', key, 'state', 'reserved', 'committed', 'expires', 'body', 'by')
local state, reserved, committed, expires, body = f[1], f[2], f[3], f[4], f[5]
-- The same attempt again: the call that moved the state under it lost its answer; answer as it did.
if attempt and state and state ~= 'reserved' and f[6] == attempt then
  if state == 'expired' and action ~= 'expire' then return { 'expired', reserved, body } end
  return { 'settled', state, reserved, committed, body }
end
-- Who moved the state (when the caller named its attempt).
local function moved_by()
  if attempt then call('HSET', key, 'by', attempt) end
end
if not state then
  if action ~= 'abort' then return { 'missing' } end
  call('HSET', key, 'state', 'aborted', 'reserved', string.format('%d', amount), 'committed', '0')
  call('PEXPIRE', key, retention)
  return { 'tombstoned' }
end

if state == 'reserved' then
  if action == 'abort' then
    call('HSET', key, 'state', 'aborted')
    call('PEXPIRE', key, retention)
    return { 'settled', 'aborted', reserved, '0', body }
  end
  local expired = clock() >= tonumber(expires)
  if action == 'expire' and not expired then return { 'not_due' } end
  if expired then
    call('HSET', key, 'state', 'expired')
    moved_by()
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
  moved_by()
  call('PEXPIRE', key, retention)
  return { 'settled', state, reserved, committed, body }
end

if (state == 'committed' and action == 'commit' and tonumber(committed) == amount)
  or (state == 'cancelled' and action == 'cancel')
  or (state == 'aborted' and action == 'abort') then
  return { 'replay', state, reserved, committed }
end
return { 'conflict', state, reserved, committed }
