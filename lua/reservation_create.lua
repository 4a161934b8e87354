--[[
reservation_create.lua: record a reservation (reserve-then-commit) whose amount an admitted decision already
charged, with its expiry on Redis time.

KEYS
  KEYS[1]  the reservation's hash, rl:resv:{<id>} (must not exist: ids are random, and an agent that could not
           learn whether this script ran leaves a tombstone there, lua/reservation_settle.lua's abort)

ARGV
  ARGV[1]  body: what the decision charged (JSON, opaque here; core/models/reservation.ts ReservationBody)
  ARGV[2]  amount reserved, micro-units (integer >= 1)
  ARGV[3]  TTL in ms (integer >= 1): uncommitted after it, the reservation expires and is refunded whole
  ARGV[4]  retention in ms (integer >= 1): how long a settled reservation is kept to answer repeats

Reply: { expiresAt } in µs of Redis time.
Errors: "QP_BADARG <what>"; "QP_EXISTS" when the key exists (nothing written). A create that reaches Redis after
its agent gave up on it and aborted the reservation finds the tombstone and writes nothing: this script charges
nothing (the decision did, and the abort gives that back), so a refused create leaves nothing to undo.

Fields of the hash: state (reserved), body, reserved (micro-units), committed (0), expires (µs).
The key lives TTL + retention: the settle script shortens or extends it to retention once settled.
]]

-- @include prelude
if #KEYS ~= 1 then return fail('expected 1 key') end
if argc ~= 4 then return fail('expected 4 arguments') end
local amount, ttl, retention = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not int(amount, 1) then return fail('amount must be an integer >= 1') end
if not int(ttl, 1) then return fail('ttl must be an integer >= 1') end
if not int(retention, 1) then return fail('retention must be an integer >= 1') end
if call('EXISTS', KEYS[1]) == 1 then return redis.error_reply('QP_EXISTS reservation exists') end

local expires = clock() + ttl * 1000
call('HSET', KEYS[1], 'state', 'reserved', 'body', ARGV[1], 'reserved', string.format('%d', amount),
  'committed', '0', 'expires', string.format('%d', expires))
call('PEXPIRE', KEYS[1], ttl + retention)
return { expires }
