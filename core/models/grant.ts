/**
 * Local grants: a client holds a small allowance of a hot subject's tokens and decides in its own process until
 * it is spent or expires. The tokens leave the subject's bucket when the grant is taken (`lua/grant.lua`, mode
 * take), exactly as a lend between regions does (core/models/transfer.ts): refill on Redis time, then take
 * `min(amount, stock)`. Never below zero, never minted. What the client did not spend is handed back (mode
 * return): a credit that fits under the bucket's ceiling, the rest dropped. So a grant lost with its process
 * (crash, lost answer) only loses tokens: fewer admissions, never more.
 *
 * A return is bound to its take: the take records the grant (the micro-tokens it took, and its bucket's key) under
 * a random id the agent draws, in the bucket's cluster slot (core/keys.ts grantRecordKey), for GRANT_RECORD_TTL_MS;
 * a return names the id, is credited at most what that grant took, and deletes the record, so a second return, a
 * forged or expired id, or another bucket's id credits nothing (`known` false). Never more than was taken.
 *
 * This file holds the script's model (operation for operation: lendBucket in `fill` mode and creditBucket, plus the
 * records), its arguments and replies, and the agent's sizing rule: at most GRANT_MAX_SHARE of the bucket.
 */
import { MAX_GRANT_TOKENS } from '../wire/grant.js';
import type { BucketModel } from './token-bucket.js';
import {
  creditBucket,
  lendBucket,
  type EncodedCreditResult,
  type EncodedLendResult,
  type TransferBucket,
} from './transfer.js';

/** Most of a bucket's capacity one grant may take: a small part, so tokens held by clients stay few. */
export const GRANT_MAX_SHARE = 0.1;
/**
 * How long a grant lives when the take does not say, ms: the client decides on it no longer, then hands the rest
 * back. A take may ask for up to MAX_GRANT_TTL_MS (core/wire/grant.ts).
 */
export const GRANT_TTL_MS = 1_000;
/** Least margin the agent keeps a grant's record past the grant's life, ms (the return's trip). */
export const GRANT_RECORD_MARGIN_MS = 1_000;

/**
 * How long the agent remembers a grant of life `ttlMs` for its return: twice its life, at least its life and
 * GRANT_RECORD_MARGIN_MS. A client that takes the next grant before this one expires holds the rest of both
 * until the next one expires, then hands it back against both: each record is still there.
 */
export function grantRecordTtl(ttlMs: number): number {
  return ttlMs + Math.max(ttlMs, GRANT_RECORD_MARGIN_MS);
}

/** How long the agent remembers a grant of the default life for its return, ms (2 s). */
export const GRANT_RECORD_TTL_MS = grantRecordTtl(GRANT_TTL_MS);
/** Most takes and returns in one script call of `lua/grant.lua` (the agent's store coalesces one turn's). */
export const MAX_GRANT_OPS_PER_CALL = 64;

/** One take or return, in script units (micro-tokens). */
export interface EncodedGrant {
  key: string;
  /** The grant's record (core/keys.ts grantRecordKey: its id, in the bucket's slot). */
  record: string;
  bucket: TransferBucket;
  /** Micro-tokens asked (take) or handed back (return), integer ≥ 1. */
  amount: number;
  /** How long a take's record is kept for its return, ms (default GRANT_RECORD_TTL_MS); unused by a return. */
  recordTtlMs?: number;
}

/** What a take answers: micro-tokens granted, left, and ms until the amount could be granted again. */
export type EncodedTakeResult = EncodedLendResult;
/**
 * What a return answers: micro-tokens credited, dropped (more than the grant took, or no room), held after (0 for
 * an unknown grant), and whether the grant was known (recorded for this bucket, not yet returned).
 */
export interface EncodedReturnResult extends EncodedCreditResult {
  known: boolean;
}

/** The grant records of one in-memory model (as Redis keeps them next to the buckets): key → record. */
const RECORDS = new WeakMap<BucketModel, Map<string, { bucket: string; amount: number; until: number }>>();

function recordsOf(model: BucketModel): Map<string, { bucket: string; amount: number; until: number }> {
  let records = RECORDS.get(model);
  if (records === undefined) {
    records = new Map();
    RECORDS.set(model, records);
  }
  return records;
}

/** Take on an in-memory model, as `lua/grant.lua` mode 1 does on Redis (`now` µs). */
export function takeOnModel(model: BucketModel, grant: EncodedGrant, now: number): EncodedTakeResult {
  const { next, result } = lendBucket(model.peek(grant.key, now), { ...grant, mode: 'fill' }, now);
  if (next !== undefined) model.write(grant.key, next, now + grant.bucket.ttlMs * 1000);
  if (result.granted > 0) {
    const records = recordsOf(model);
    for (const [k, r] of records) if (r.until <= now) records.delete(k);
    records.set(grant.record, {
      bucket: grant.key,
      amount: result.granted,
      until: now + (grant.recordTtlMs ?? GRANT_RECORD_TTL_MS) * 1000,
    });
  }
  return result;
}

/** Return on an in-memory model, as `lua/grant.lua` mode 2 does on Redis (`now` µs). */
export function returnOnModel(model: BucketModel, grant: EncodedGrant, now: number): EncodedReturnResult {
  const records = recordsOf(model);
  const record = records.get(grant.record);
  if (record === undefined || record.until <= now || record.bucket !== grant.key) {
    return { credited: 0, dropped: grant.amount, tokens: 0, known: false };
  }
  records.delete(grant.record);
  const give = Math.min(grant.amount, record.amount);
  const { next, result } = creditBucket(model.peek(grant.key, now), { ...grant, amount: give }, now);
  if (next !== undefined) model.write(grant.key, next, now + grant.bucket.ttlMs * 1000);
  return { ...result, dropped: grant.amount - result.credited, known: true };
}

/** KEYS and ARGV of `lua/grant.lua`. */
export function grantArguments(
  mode: 'take' | 'return',
  grant: EncodedGrant,
): { keys: string[]; argv: string[] } {
  const b = grant.bucket;
  return {
    keys: [grant.key, grant.record],
    argv: [
      mode === 'take' ? '1' : '2',
      String(grant.amount),
      String(b.capacity),
      String(b.rate),
      String(b.ttlMs),
      String(b.floorBefore),
      String(b.floorRate),
      String(b.floorCapacity),
      String(grant.recordTtlMs ?? GRANT_RECORD_TTL_MS),
    ],
  };
}

/** One operation of a batched script call: a take or a return. */
export interface GrantOp {
  mode: 'take' | 'return';
  grant: EncodedGrant;
}

/** KEYS and ARGV of one `lua/grant.lua` call carrying `ops` (1..MAX_GRANT_OPS_PER_CALL), run in order. */
export function grantBatchArguments(ops: readonly GrantOp[]): { keys: string[]; argv: string[] } {
  if (ops.length < 1 || ops.length > MAX_GRANT_OPS_PER_CALL)
    throw new RangeError(`a grant script call carries 1..${MAX_GRANT_OPS_PER_CALL} operations`);
  const keys: string[] = [];
  const argv: string[] = [];
  for (const op of ops) {
    const one = grantArguments(op.mode, op.grant);
    keys.push(...one.keys);
    argv.push(...one.argv);
  }
  return { keys, argv };
}

/** Parse the reply of a call carrying operations of `modes`, in order (3 integers a take, 4 a return). */
export function parseBatchReply(
  reply: unknown,
  modes: readonly GrantOp['mode'][],
): (EncodedTakeResult | EncodedReturnResult)[] {
  const width = modes.reduce((n, m) => n + (m === 'take' ? 3 : 4), 0);
  const all = integers(reply, 'grant batch', width);
  const out: (EncodedTakeResult | EncodedReturnResult)[] = [];
  let at = 0;
  for (const mode of modes) {
    if (mode === 'take') {
      out.push(parseTakeReply(all.slice(at, at + 3)));
      at += 3;
    } else {
      out.push(parseReturnReply(all.slice(at, at + 4)));
      at += 4;
    }
  }
  return out;
}

function integers(reply: unknown, what: string, length: number): number[] {
  if (!Array.isArray(reply) || reply.length !== length || !reply.every((v) => Number.isSafeInteger(v))) {
    throw new TypeError(`unexpected ${what} reply: ${JSON.stringify(reply)?.slice(0, 200)}`);
  }
  return reply as number[];
}

/** Parse a take's reply. */
export function parseTakeReply(reply: unknown): EncodedTakeResult {
  const [granted, remaining, refillMs] = integers(reply, 'grant take', 3) as [number, number, number];
  return { granted, remaining, refillMs };
}

/** Parse a return's reply. */
export function parseReturnReply(reply: unknown): EncodedReturnResult {
  const [credited, dropped, tokens, known] = integers(reply, 'grant return', 4) as [
    number,
    number,
    number,
    number,
  ];
  return { credited, dropped, tokens, known: known === 1 };
}

/**
 * The most a grant may take from a bucket of `capacity` whole tokens: GRANT_MAX_SHARE of it (at least 1, at most
 * MAX_GRANT_TOKENS), whole tokens.
 */
export function grantCeiling(capacity: number): number {
  return Math.max(1, Math.min(MAX_GRANT_TOKENS, Math.floor(capacity * GRANT_MAX_SHARE)));
}
