-- The prelude every script starts with (`-- @include prelude`, expanded by regional-agent/redis/scripts.ts
-- luaSource before the script is loaded): local aliases, the clock, and the argument checks.

local huge = math.huge
local floor = math.floor
local ceil = math.ceil
local min = math.min
local max = math.max
local tonumber = tonumber
local call = redis.call
local fmt = string.format

-- @clock-begin (the test build swaps this block for a clock read from a trailing argument; production
-- decisions use Redis time only)
local argc = #ARGV
local function clock()
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- @clock-end

-- A refused argument: "QP_BADARG <what>", which the agent reports as the caller's error, never the store's.
local function fail(message)
  return redis.error_reply('QP_BADARG ' .. message)
end

-- A finite integer >= lo (NaN fails every comparison).
local function int(v, lo)
  return v and v == v and v >= lo and v < huge and v % 1 == 0
end
