/**
 * Local grants: a client holds a small allowance of a hot subject's tokens and decides in its own process until
 * it is spent or expires. The tokens leave the subject's bucket when the grant is taken (`lua/grant.lua`, mode
 * take), exactly as a lend between regions does (core/borrowing/transfer.ts): refill on Redis time, then take
 * `min(amount, stock)`. Never below zero, never minted. What the client did not spend is handed back (mode
 * return): a credit that fits under the bucket's ceiling, the rest dropped. So a grant lost with its process
 * (crash, lost answer) only loses tokens: fewer admissions, never more.
 *
 * This file holds the script's model (operation for operation: lendBucket in `fill` mode and creditBucket), its
 * arguments and replies, and the agent's sizing rule: at most GRANT_MAX_SHARE of the bucket in one grant.
 */
import { MAX_GRANT_TOKENS } from './grant-wire.js';
import type { BucketModel } from './token-bucket.js';
import {
  creditBucket,
  lendBucket,
  type EncodedCreditResult,
  type EncodedLendResult,
  type TransferBucket,
} from './borrowing/transfer.js';

/** Most of a bucket's capacity one grant may take: a small part, so tokens held by clients stay few. */
export const GRANT_MAX_SHARE = 0.1;
/** How long a grant lives, ms: the client decides on it no longer, then hands the rest back. */
export const GRANT_TTL_MS = 1_000;

/** One take or return, in script units (micro-tokens). */
export interface EncodedGrant {
  key: string;
  bucket: TransferBucket;
  /** Micro-tokens asked (take) or handed back (return), integer ≥ 1. */
  amount: number;
}

/** What a take answers: micro-tokens granted, left, and ms until the amount could be granted again. */
export type EncodedTakeResult = EncodedLendResult;
/** What a return answers: micro-tokens credited, dropped (no room), and held after. */
export type EncodedReturnResult = EncodedCreditResult;

/** Take on an in-memory model, as `lua/grant.lua` mode 1 does on Redis. */
export function takeOnModel(model: BucketModel, grant: EncodedGrant, now: number): EncodedTakeResult {
  const { next, result } = lendBucket(model.peek(grant.key, now), { ...grant, mode: 'fill' }, now);
  if (next !== undefined) model.write(grant.key, next, now + grant.bucket.ttlMs * 1000);
  return result;
}

/** Return on an in-memory model, as `lua/grant.lua` mode 2 does on Redis. */
export function returnOnModel(model: BucketModel, grant: EncodedGrant, now: number): EncodedReturnResult {
  const { next, result } = creditBucket(model.peek(grant.key, now), grant, now);
  if (next !== undefined) model.write(grant.key, next, now + grant.bucket.ttlMs * 1000);
  return result;
}

/** KEYS and ARGV of `lua/grant.lua`. */
export function grantArguments(
  mode: 'take' | 'return',
  grant: EncodedGrant,
): { keys: string[]; argv: string[] } {
  const b = grant.bucket;
  return {
    keys: [grant.key],
    argv: [
      mode === 'take' ? '1' : '2',
      String(grant.amount),
      String(b.capacity),
      String(b.rate),
      String(b.ttlMs),
      String(b.floorBefore),
      String(b.floorRate),
      String(b.floorCapacity),
    ],
  };
}

function integers(reply: unknown, what: string): [number, number, number] {
  if (!Array.isArray(reply) || reply.length !== 3 || !reply.every((v) => Number.isSafeInteger(v))) {
    throw new TypeError(`unexpected ${what} reply: ${JSON.stringify(reply)?.slice(0, 200)}`);
  }
  return reply as [number, number, number];
}

/** Parse a take's reply. */
export function parseTakeReply(reply: unknown): EncodedTakeResult {
  const [granted, remaining, refillMs] = integers(reply, 'grant take');
  return { granted, remaining, refillMs };
}

/** Parse a return's reply. */
export function parseReturnReply(reply: unknown): EncodedReturnResult {
  const [credited, dropped, tokens] = integers(reply, 'grant return');
  return { credited, dropped, tokens };
}

/**
 * The most a grant may take from a bucket of `capacity` whole tokens: GRANT_MAX_SHARE of it (at least 1, at most
 * MAX_GRANT_TOKENS), whole tokens.
 */
export function grantCeiling(capacity: number): number {
  return Math.max(1, Math.min(MAX_GRANT_TOKENS, Math.floor(capacity * GRANT_MAX_SHARE)));
}
