/**
 * Token transfer between the regions' buckets of one subject: the exact arithmetic of `lua/lend.lua` and
 * `lua/credit.lua`, and the rules that keep it exact.
 *
 * Each region r holds the subject's bucket with stock_r ≤ cap_r = C·s_r, refilled at R·s_r (core/models/token-bucket.ts).
 * A transfer moves tokens that exist already; it never mints:
 * - **lend** (at the lender, on its Redis time): refill the lender's bucket, then take
 *   `granted = min(amount, stock)` (`fill`: the borrower fills its bucket with them) or, when the borrower's
 *   bucket can never hold the cost, `granted = stock ≥ cost ? cost : 0` (`spend`: the lender charges the cost
 *   itself, as if it admitted the request). Never below zero, never more than asked.
 * - **credit** (at the borrower, on its Redis time): refill the borrower's bucket, then add
 *   `min(granted, ceiling − stock)`, ceiling = the lower of the stored and the given capacity; the rest is dropped
 *   (and counted by the caller).
 * So every stock stays ≤ its cap, Φ = Σ_r stock_r ≤ Σ_r cap_r ≤ C at every instant, and a subject's admissions over
 * any window W are at most Φ(start) + R·W ≤ C + R·W. A loan lost on the way loses tokens (safe). Nothing is held
 * above a cap, so no loan needs bookkeeping.
 *
 * Units are the scripts': micro-tokens (integers) and microseconds. The simulator calls these functions on its
 * in-memory buckets; a shared case table (test/cases/transfer-cases.ts) holds the scripts to them.
 */
import { encodeRequest, type BucketCheck } from '../wire/bucket.js';
import {
  microsUntil,
  refill,
  type BucketModel,
  type EncodedCheck,
  type StoredBucket,
} from './token-bucket.js';

/**
 * What a lender keeps for its own requests when it lends `spare` (a top-up, asked ahead of need): half its
 * burst, rounded down (`floor(capacity / 2)` micro-tokens, as lua/lend.lua computes it). A lender busy with the
 * subject itself is not drained by another region's top-ups; a refusal's `fill` takes everything.
 */
export const SPARE_RESERVE = 0.5;

/**
 * How a lender gives: `fill` hands over up to the amount; `spend` charges exactly the amount or nothing; `spare`
 * hands over up to the amount from what it holds above SPARE_RESERVE of its burst.
 */
export type LendMode = 'fill' | 'spend' | 'spare';

/** A bucket's parameters for a transfer: a decision's check without its cost, in script units. */
export type TransferBucket = Omit<EncodedCheck, 'cost'>;

/** One lend, in script units. */
export interface EncodedLend {
  key: string;
  bucket: TransferBucket;
  mode: LendMode;
  /** Micro-tokens asked (integer ≥ 1): the borrower's room (`fill`) or the request's cost (`spend`). */
  amount: number;
}

/** What a lend answers, in script units. */
export interface EncodedLendResult {
  /** Micro-tokens taken from the lender's bucket and handed to the borrower (`spend`: charged for it). */
  granted: number;
  /** Micro-tokens left in the lender's bucket. */
  remaining: number;
  /**
   * Milliseconds until the lender's bucket could grant the amount again (up to its capacity): 0 when it could
   * now, -1 when it never will (no refill, or no capacity).
   */
  refillMs: number;
}

/** One credit, in script units. */
export interface EncodedCredit {
  key: string;
  bucket: TransferBucket;
  /** Micro-tokens granted by lenders (integer ≥ 1). */
  amount: number;
}

/** What a credit answers, in script units. */
export interface EncodedCreditResult {
  /** Micro-tokens added to the bucket. */
  credited: number;
  /** Micro-tokens that found no room (the bucket was fuller than when it asked): gone, counted. */
  dropped: number;
  /** Micro-tokens in the bucket after the credit. */
  tokens: number;
}

/**
 * A decision's bucket in script units, for a transfer: the same rounding as a decision (capacity rounds down),
 * so a lend or credit sizes the bucket exactly as the decision that follows it does.
 */
export function transferBucket(bucket: Omit<BucketCheck, 'cost'>): TransferBucket {
  const [check] = encodeRequest({ checks: [{ ...bucket, cost: 1 }] }).checks;
  // mustExist guards a decision only (subject-creation cap): a transfer moves tokens, whatever the bucket.
  const { cost: _cost, mustExist: _mustExist, ...rest } = check!;
  return rest;
}

const asCheck = (bucket: TransferBucket): EncodedCheck => ({ ...bucket, cost: 1 });

function msFromMicros(us: number): number {
  return us < 0 ? -1 : Math.ceil(us / 1000);
}

/**
 * Lend from a stored bucket at `now` (µs). Returns the bucket to store (undefined: write nothing; the state is
 * what the next refill computes anyway) and the result.
 */
export function lendBucket(
  stored: StoredBucket | undefined,
  lend: Omit<EncodedLend, 'key'>,
  now: number,
): { next: StoredBucket | undefined; result: EncodedLendResult } {
  const check = asCheck(lend.bucket);
  const state = refill(stored, check, now);
  let granted: number;
  if (lend.mode === 'spend') granted = state.tokens >= lend.amount ? lend.amount : 0;
  else if (lend.mode === 'spare')
    granted = Math.min(lend.amount, Math.max(0, state.tokens - Math.floor(check.capacity / 2)));
  else granted = Math.min(lend.amount, state.tokens);
  if (granted < 0) granted = 0;
  const remaining = state.tokens - granted;
  // A spend can only ever be granted whole; a fill, up to the bucket's capacity.
  const never = check.capacity <= 0 || (lend.mode === 'spend' && lend.amount > check.capacity);
  const target = Math.min(lend.amount, check.capacity);
  const refillMs = never ? -1 : msFromMicros(microsUntil(remaining, state.carry, target, check.rate));
  const result = { granted, remaining, refillMs };
  if (granted === 0) return { next: undefined, result };
  return { next: { ...state, tokens: remaining }, result };
}

/**
 * Credit granted tokens to a stored bucket at `now` (µs), never above the lower of its stored and given capacity.
 * Returns the bucket to store (undefined: nothing was added, write nothing) and the result. A missing bucket is
 * full: everything is dropped and it stays missing.
 */
export function creditBucket(
  stored: StoredBucket | undefined,
  credit: Omit<EncodedCredit, 'key'>,
  now: number,
): { next: StoredBucket | undefined; result: EncodedCreditResult } {
  if (stored === undefined) {
    const tokens = credit.bucket.capacity;
    return { next: undefined, result: { credited: 0, dropped: credit.amount, tokens } };
  }
  const ceiling = Math.min(stored.capacity, credit.bucket.capacity);
  const state = refill(stored, asCheck(credit.bucket), now);
  const room = Math.max(0, ceiling - state.tokens);
  const credited = Math.min(credit.amount, room);
  const dropped = credit.amount - credited;
  if (credited === 0) return { next: undefined, result: { credited, dropped, tokens: state.tokens } };
  const tokens = state.tokens + credited;
  const carry = tokens >= ceiling ? 0 : state.carry;
  return { next: { ...state, tokens, carry }, result: { credited, dropped, tokens } };
}

/** Lend on an in-memory model (the simulator's buckets), as `lua/lend.lua` does on Redis. */
export function lendOnModel(model: BucketModel, lend: EncodedLend, now: number): EncodedLendResult {
  const { next, result } = lendBucket(model.peek(lend.key, now), lend, now);
  if (next !== undefined) model.write(lend.key, next, now + lend.bucket.ttlMs * 1000);
  return result;
}

/** Credit on an in-memory model, as `lua/credit.lua` does on Redis. */
export function creditOnModel(model: BucketModel, credit: EncodedCredit, now: number): EncodedCreditResult {
  const { next, result } = creditBucket(model.peek(credit.key, now), credit, now);
  if (next !== undefined) model.write(credit.key, next, now + credit.bucket.ttlMs * 1000);
  return result;
}

const LEND_MODES: Record<LendMode, string> = { fill: '1', spend: '2', spare: '3' };

function bucketArgs(bucket: TransferBucket): string[] {
  return [
    String(bucket.capacity),
    String(bucket.rate),
    String(bucket.ttlMs),
    String(bucket.floorBefore),
    String(bucket.floorRate),
    String(bucket.floorCapacity),
  ];
}

/**
 * KEYS and ARGV of `lua/lend.lua`. `deadlineMicros` (Redis time, µs; 0 = none): a lend that runs later changes
 * nothing, because the borrower has stopped waiting and the tokens would be lost.
 */
export function lendArguments(lend: EncodedLend, deadlineMicros = 0): { keys: string[]; argv: string[] } {
  if (!(Number.isSafeInteger(deadlineMicros) && deadlineMicros >= 0)) {
    throw new RangeError(`deadline must be a whole number of microseconds >= 0, got ${deadlineMicros}`);
  }
  return {
    keys: [lend.key],
    argv: [LEND_MODES[lend.mode], String(lend.amount), String(deadlineMicros), ...bucketArgs(lend.bucket)],
  };
}

/** KEYS and ARGV of `lua/credit.lua`. */
export function creditArguments(credit: EncodedCredit): { keys: string[]; argv: string[] } {
  return { keys: [credit.key], argv: [String(credit.amount), ...bucketArgs(credit.bucket)] };
}

/** The lend ran after its deadline and changed nothing (its reply was `{-1}`). */
export class LendTooLateError extends Error {
  readonly code = 'QP_LEND_TOO_LATE';
  constructor() {
    super('the store ran the lend after its deadline: nothing was taken');
    this.name = 'LendTooLateError';
  }
}

function integers(reply: unknown, n: number, what: string): number[] {
  if (!Array.isArray(reply) || reply.length !== n || !reply.every((v) => Number.isSafeInteger(v))) {
    throw new TypeError(`unexpected ${what} reply: ${JSON.stringify(reply)?.slice(0, 200)}`);
  }
  return reply as number[];
}

/** Parse `lua/lend.lua`'s reply; throws LendTooLateError for `{-1}`, TypeError for any other shape. */
export function parseLendReply(reply: unknown): EncodedLendResult {
  if (Array.isArray(reply) && reply.length === 1 && reply[0] === -1) throw new LendTooLateError();
  const [granted, remaining, refillMs] = integers(reply, 3, 'lend');
  return { granted: granted!, remaining: remaining!, refillMs: refillMs! };
}

/** Parse `lua/credit.lua`'s reply. */
export function parseCreditReply(reply: unknown): EncodedCreditResult {
  const [credited, dropped, tokens] = integers(reply, 3, 'credit');
  return { credited: credited!, dropped: dropped!, tokens: tokens! };
}
