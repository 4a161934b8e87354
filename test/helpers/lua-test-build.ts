import { luaSource } from '../../regional-agent/redis/scripts.js';

/**
 * A script with its clock block swapped for a trailing ARGV holding "now" in µs, so the shared case tables can
 * drive exact instants on a real Redis. Everything but the clock is the production text.
 */
export function withClockArg(name: string): string {
  const source = luaSource(name);
  const replaced = source.replace(
    /-- @clock-begin[\s\S]*?-- @clock-end/,
    'local argc = #ARGV - 1\nlocal function clock() return tonumber(ARGV[#ARGV]) end',
  );
  if (replaced === source) throw new Error(`clock block not found in ${name}.lua`);
  return replaced;
}

/** `lua/token_bucket.lua` with its clock read from a trailing argument. */
export function tokenBucketWithClockArg(): string {
  return withClockArg('token_bucket');
}
