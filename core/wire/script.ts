/**
 * What the scripts' wire formats share. Every script answers a flat list of integers, `{-1}` when it ran after
 * the call's deadline. The per-subject counter scripts (`lua/sliding_log.lua`, `lua/daily_budget.lua` and their
 * refunds) also share a call's shape: up to 16 checks of one slot decided all-or-nothing, with an optional
 * idempotency record in that slot. A leaf module: the token-bucket wire (core/wire/bucket.ts) and the models
 * import it, never the other way round.
 */
import { createHash } from 'node:crypto';
import type { RegionalShare } from '../shares/shares.js';

/**
 * A script's flat reply of exactly `length` integers, as the Lua scripts answer; throws a TypeError naming `what`
 * when its shape is not that.
 */
export function integerReply(reply: unknown, length: number, what: string): number[] {
  if (!Array.isArray(reply) || reply.length !== length || !reply.every((v) => Number.isInteger(v))) {
    throw new TypeError(`unexpected ${what}: ${JSON.stringify(reply)?.slice(0, 200)}`);
  }
  return reply as number[];
}

/** The script ran after the call's deadline and changed nothing (its reply was `{-1}`). */
export class DeadlinePassedError extends Error {
  readonly code = 'QP_DEADLINE_PASSED';
  constructor() {
    super('the store ran the call after its deadline: nothing was decided or charged');
    this.name = 'DeadlinePassedError';
  }
}

/** What every counter call carries besides its checks. */
export interface CounterCall {
  checks: readonly { key: string }[];
  idempotency?: { key: string; ttlMs: number } | undefined;
  dryRun?: boolean | undefined;
}

/** A refund of counter entries: the keys, one entry per key, and the idempotency record to delete. */
export interface CounterRefund {
  keys: readonly string[];
  entries: readonly unknown[];
  recordKey?: string | undefined;
}

/** SHA-1 of a request's keys and costs (`key cost` lines), as the scripts compute it for an idempotency record. */
export function keyCostFingerprint(pairs: readonly { key: string; cost: number }[]): string {
  const parts = pairs.map((p) => `${p.key} ${String(p.cost)}`);
  return createHash('sha1').update(parts.join('\n'), 'utf8').digest('hex');
}

/**
 * KEYS and the head of ARGV of a counter call: the checks' keys, then the record's; ARGV `checks, flags (1 dry
 * run, 2 idempotent), record TTL ms, deadline µs of Redis time (0 = none)`. The caller appends each check's fields.
 */
export function counterCallHead(request: CounterCall, deadline: number): { keys: string[]; argv: string[] } {
  const keys = request.checks.map((c) => c.key);
  if (request.idempotency !== undefined) keys.push(request.idempotency.key);
  const flags = (request.dryRun === true ? 1 : 0) + (request.idempotency === undefined ? 0 : 2);
  const argv = [
    String(request.checks.length),
    String(flags),
    String(request.idempotency?.ttlMs ?? 0),
    String(deadline),
  ];
  return { keys, argv };
}

/**
 * KEYS and ARGV of a refund call: the keys, then the record's when there is one; ARGV `entries, record flag`, then
 * each entry's `fields`.
 */
export function counterRefundArguments<E>(
  refund: CounterRefund & { entries: readonly E[] },
  fields: (entry: E) => number[],
): { keys: string[]; argv: string[] } {
  const keys = refund.recordKey === undefined ? [...refund.keys] : [...refund.keys, refund.recordKey];
  const argv = [String(refund.entries.length), refund.recordKey === undefined ? '0' : '1'];
  for (const e of refund.entries) for (const v of fields(e)) argv.push(String(v));
  return { keys, argv };
}

/**
 * A counter call's reply: `allowed, replayed (1) or conflict (2)`, then `width` integers per check, read by
 * `result`. Throws DeadlinePassedError for `{-1}` and a TypeError naming `what` for any other shape.
 */
export function parseCounterReply<R>(
  reply: unknown,
  checks: number,
  width: number,
  what: string,
  result: (v: number[], at: number) => R,
): { allowed: boolean; replayed: boolean; conflict: boolean; results: R[] } {
  if (Array.isArray(reply) && reply.length === 1 && reply[0] === -1) throw new DeadlinePassedError();
  const v = integerReply(reply, 2 + width * checks, what);
  const results: R[] = [];
  for (let i = 0; i < checks; i++) results.push(result(v, 2 + width * i));
  return { allowed: v[0] === 1, replayed: v[1] === 1, conflict: v[1] === 2, results };
}

/** A refund call's reply: one count per check, then 1 when the idempotency record was deleted. */
export function parseCounterRefundReply(
  reply: unknown,
  checks: number,
  what: string,
): { counts: number[]; recordDeleted: boolean } {
  const v = integerReply(reply, checks + 1, what);
  return { counts: v.slice(0, checks), recordDeleted: v[checks] === 1 };
}

/**
 * The share a counter is sized by: the lowest of the share in force, the lowest within the idle TTL and the
 * refill floor. Entries admitted under a smaller share still count, so a share that rose is used in full only
 * once they have gone.
 */
export function lowestShare(share: RegionalShare | number): number {
  if (typeof share === 'number') return share;
  return Math.min(share.share, share.lowest ?? share.share, share.floor?.share ?? share.share);
}
