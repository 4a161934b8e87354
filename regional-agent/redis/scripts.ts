import { readFileSync } from 'node:fs';
import type { Cluster, Redis } from 'ioredis';
import { onTheWire } from '../resilience/wire-timeout.js';

/** Directory of the Lua scripts, resolved from this module so it works from any working directory. */
const LUA_DIR = new URL('../../lua/', import.meta.url);

const cache = new Map<string, string>();

/** A line `-- @include <name>` stands for `lua/include/<name>.lua` (Redis scripts cannot load one another). */
const INCLUDE = /^-- @include ([a-z_]+)\r?$/gm;

/** Source of `lua/<name>.lua`, read once, with its `-- @include` lines expanded. */
export function luaSource(name: string): string {
  let source = cache.get(name);
  if (source === undefined) {
    source = readFileSync(new URL(`${name}.lua`, LUA_DIR), 'utf8').replace(INCLUDE, (_, part: string) =>
      readFileSync(new URL(`include/${part}.lua`, LUA_DIR), 'utf8').trimEnd(),
    );
    cache.set(name, source);
  }
  return source;
}

/** The Redis refused the script (as opposed to denying a request). */
export class ScriptError extends Error {
  readonly code = 'QP_SCRIPT_ERROR';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ScriptError';
  }
}

/**
 * Errors a script raises for its caller's request, not for the store's health: an argument it refuses
 * (`QP_BADARG`), a reservation that already exists (`QP_EXISTS`), keys in different cluster slots.
 */
const CALLER_ERRORS = /^(QP_BADARG|QP_EXISTS|CROSSSLOT)/;

/** Define `lua/<script>.lua` on `redis` as a command (once per connection); returns the command's name. */
export function defineScript(redis: Redis | Cluster, script: string): string {
  const command = commandName(script);
  // Command names are lua/ file names (commandName), never a caller's: a method of the client, looked up as one.
  // eslint-disable-next-line quotaplane/no-untrusted-record-key
  if (typeof (redis as unknown as Record<string, unknown>)[command] !== 'function') {
    redis.defineCommand(command, { lua: luaSource(script) });
  }
  return command;
}

/**
 * Run a script defined as `command` (defineScript), its reply timed on the wire; a caller's error is a
 * ScriptError, never a store failure.
 */
export async function runScript(
  redis: Redis | Cluster,
  command: string,
  keys: readonly string[],
  argv: readonly string[],
  timeoutMs: number,
  what: string,
): Promise<unknown> {
  // eslint-disable-next-line quotaplane/no-untrusted-record-key -- a lua/ file name (defineScript), never a caller's
  const call = (redis as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>)[command]!;
  try {
    return await onTheWire(call.call(redis, keys.length, ...keys, ...argv), timeoutMs, what);
  } catch (error) {
    if (error instanceof Error && CALLER_ERRORS.test(error.message)) {
      throw new ScriptError(error.message, { cause: error });
    }
    throw error;
  }
}

/** The ioredis command a script is defined as: `qp` + the script's name in camel case. */
function commandName(script: string): string {
  return 'qp' + script.replace(/(^|_)([a-z])/g, (_, __, c: string) => c.toUpperCase());
}
