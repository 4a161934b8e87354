import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Cluster, type Redis } from 'ioredis';
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
  if (!sources.has(command)) {
    const lua = luaSource(script);
    sources.set(command, { lua, sha: createHash('sha1').update(lua).digest('hex') });
  }
  return command;
}

/** Each defined command's source and SHA1, for the calls that send EVALSHA and EVAL themselves (WAIT). */
const sources = new Map<string, { lua: string; sha: string }>();

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
  const ack = replicaAcks.get(redis);
  try {
    if (ack === undefined)
      return await onTheWire(call.call(redis, keys.length, ...keys, ...argv), timeoutMs, what);
    // WAIT goes out right behind the script on the same connection: one round trip plus replication. EVALSHA and
    // EVAL are sent here, not by the defined command: after its NOSCRIPT (a flushed script cache) ioredis sends
    // EVAL again by itself, behind a WAIT that was answered for the refused EVALSHA, so the script's writes went
    // unacknowledged and an admission no replica held was answered (found by review).
    const { lua, sha } = sources.get(command)!;
    const send = (op: 'evalsha' | 'eval', body: string) => {
      const reply = (redis as Redis).call(op, body, keys.length, ...keys, ...argv);
      const acked = (redis as Redis).wait(ack.replicas, ack.timeoutMs);
      acked.catch(() => undefined);
      return { reply, acked };
    };
    let sent = send('evalsha', sha);
    let result: unknown;
    try {
      result = await onTheWire(sent.reply, timeoutMs, what);
    } catch (error) {
      if (!(error instanceof Error && error.message.startsWith('NOSCRIPT'))) throw error;
      sent = send('eval', lua);
      result = await onTheWire(sent.reply, timeoutMs, what);
    }
    const replicas = await onTheWire(sent.acked, timeoutMs + ack.timeoutMs, `${what} WAIT`);
    if (replicas < ack.replicas) throw new ReplicaAckError(what, ack, replicas);
    return result;
  } catch (error) {
    if (error instanceof Error && CALLER_ERRORS.test(error.message)) {
      throw new ScriptError(error.message, { cause: error });
    }
    throw error;
  }
}

/** How many replicas must hold a script's writes before its reply counts (Redis `WAIT`). */
export interface ReplicaAck {
  readonly replicas: number;
  readonly timeoutMs: number;
}

/** Clients whose script calls wait for replicas (ackReplicas); a setting of the connection, as its scripts are. */
const replicaAcks = new WeakMap<Redis | Cluster, ReplicaAck>();

/**
 * Every script call on `redis` from now on is answered only once `ack.replicas` replicas hold its writes: a
 * failover then cannot forget a decision that was answered. One Redis or Sentinel only (WAIT has no slot).
 */
export function ackReplicas(redis: Redis | Cluster, ack: ReplicaAck): void {
  if (redis instanceof Cluster)
    throw new Error('WAIT after scripts needs one Redis or Sentinel, not a cluster');
  if (ack.replicas > 0) replicaAcks.set(redis, ack);
}

/**
 * A script ran but fewer replicas than asked acknowledged its writes in time: the decision is a store failure
 * (its policy's failure mode), and whatever it charged stays charged, so a later failover can only forget tokens
 * that were never handed out.
 */
export class ReplicaAckError extends Error {
  readonly code = 'QP_REPLICA_ACK';
  constructor(what: string, ack: ReplicaAck, acknowledged: number) {
    super(`${what}: ${acknowledged} of ${ack.replicas} replicas acknowledged within ${ack.timeoutMs} ms`);
    this.name = 'ReplicaAckError';
  }
}

/** The ioredis command a script is defined as: `qp` + the script's name in camel case. */
function commandName(script: string): string {
  return 'qp' + script.replace(/(^|_)([a-z])/g, (_, __, c: string) => c.toUpperCase());
}
