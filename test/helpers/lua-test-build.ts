import { luaSource } from '../../regional-agent/redis/scripts.js';

/**
 * The token-bucket script with its clock block swapped for a trailing ARGV holding "now" in µs, so the shared
 * case table can drive exact instants on a real Redis. Everything but the clock is the production text.
 */
export function tokenBucketWithClockArg(): string {
  const source = luaSource('token_bucket');
  const replaced = source.replace(
    /-- @clock-begin[\s\S]*?-- @clock-end/,
    'local argc = #ARGV - 1\nlocal function clock() return tonumber(ARGV[#ARGV]) end',
  );
  if (replaced === source) throw new Error('clock block not found in token_bucket.lua');
  return replaced;
}
