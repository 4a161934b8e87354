/**
 * The refund model: the exact arithmetic of `lua/refund.lua`. A layered request whose checks live in several
 * Redis Cluster slots is decided slot by slot; when a later slot denies, the grants of the earlier ones are
 * given back with this operation so that no grant survives the denial.
 *
 * Units are the scripts' (micro-tokens). A refund reads no clock (unless it carries a deadline, past which it
 * changes nothing): it adds back exactly what was charged, up to the lower of the stored and the given capacity,
 * never takes anything away, and leaves a missing (expired) bucket missing, because a missing bucket is already full.
 * The deadline is for tokens a client took ahead (packages/client/src/direct.ts): handed back only within their
 * horizon.
 */
import { z } from 'zod';
import { encodeRequest, MAX_CHECKS_PER_CALL, validStoreRequest } from '../wire/bucket.js';
import { MAX_CAPACITY } from '../policy/policy.js';
import { type EncodedRefund, type EncodedRefundReply, type EncodedRefundResult } from '../wire/refund.js';
import { IdempotencyRecords, type RecordClaim } from './idempotency.js';
import {
  BucketModel,
  conflictReply,
  requestFingerprint,
  type EncodedReply,
  type EncodedRequest,
  type StoredBucket,
} from './token-bucket.js';

/** One bucket to give tokens back to, in tokens (the same values the decision was made with). */
export const RefundCheck = z.strictObject({
  key: z.string().min(1).max(512),
  /** Tokens the decision charged. */
  cost: z.number().positive().max(MAX_CAPACITY),
  /** Capacity in tokens the decision was made with. */
  capacity: z.number().min(0).max(MAX_CAPACITY),
});
export type RefundCheck = z.infer<typeof RefundCheck>;

/** One refund call: buckets of one slot, and the idempotency record (same slot) to delete, if any. */
export const RefundRequest = z.strictObject({
  checks: z.array(RefundCheck).min(1).max(MAX_CHECKS_PER_CALL),
  idempotencyRecordKey: z.string().min(1).max(512).optional(),
  /** µs of Redis TIME after which the refund changes nothing. */
  deadlineMicros: z.number().int().min(1).optional(),
});
export type RefundRequest = z.infer<typeof RefundRequest>;

/**
 * Validate a refund and convert it to script units. Costs and capacities go through the bucket wire format's own
 * rounding, so a refund gives back exactly the micro-tokens the decision took.
 */
export function encodeRefund(request: RefundRequest): EncodedRefund {
  const parsed = validStoreRequest(RefundRequest, request);
  const encoded = encodeRequest({
    checks: parsed.checks.map((c) => ({
      key: c.key,
      capacity: c.capacity,
      refillPerSecond: 0,
      cost: c.cost,
      ttlMs: 1,
    })),
  });
  return {
    keys: parsed.checks.map((c) => c.key),
    checks: encoded.checks.map((c) => ({ cost: c.cost, capacity: c.capacity })),
    recordKey: parsed.idempotencyRecordKey,
    deadline: parsed.deadlineMicros,
  };
}

export {
  parseRefundReply,
  refundArguments,
  type EncodedRefund,
  type EncodedRefundReply,
  type EncodedRefundResult,
} from '../wire/refund.js';

/**
 * Give `cost` micro-tokens back to a stored bucket, as the script does. Returns the bucket to store (undefined
 * when the key is gone: it stays gone) and the result.
 */
export function refundBucket(
  stored: StoredBucket | undefined,
  check: { cost: number; capacity: number },
): { next: StoredBucket | undefined; result: EncodedRefundResult } {
  if (stored === undefined) return { next: undefined, result: { refunded: 0, tokens: -1 } };
  const ceiling = Math.min(stored.capacity, check.capacity);
  let after = Math.min(stored.tokens + check.cost, ceiling);
  if (after < stored.tokens) after = stored.tokens;
  const refunded = after - stored.tokens;
  if (refunded <= 0) return { next: stored, result: { refunded: 0, tokens: stored.tokens } };
  const next = { ...stored, tokens: after, carry: after >= ceiling ? 0 : stored.carry };
  return { next, result: { refunded, tokens: after } };
}

/**
 * Buckets that can be charged and refunded, with idempotency records that a refund can delete: the reference
 * model `lua/token_bucket.lua` and `lua/refund.lua` together must agree with, and the in-memory store of unit
 * tests and the simulator. Buckets live in a BucketModel; records are kept here (same rules as the script) so a
 * refund can drop them.
 */
export class RefundableBucketModel {
  readonly buckets = new BucketModel();
  readonly #records = new IdempotencyRecords<EncodedReply>();

  /** A claim of the record key `key` at `now` (µs), as Redis answers it (`IdempotencyRecords.claim`). */
  claimRecord(key: string, value: string, ttlMs: number, now: number, peekOnly: boolean): RecordClaim {
    return this.#records.claim(key, value, ttlMs, now, peekOnly);
  }

  /** Decide one call at `now` (µs), exactly as `lua/token_bucket.lua` would. */
  evaluate(request: EncodedRequest, now: number): EncodedReply {
    const { idempotency } = request;
    if (idempotency === undefined) return this.buckets.evaluate(request, now);
    const fingerprint = requestFingerprint(request);
    const recalled = this.#records.recall(idempotency.key, fingerprint, now);
    if (recalled === 'conflict') return conflictReply(request.checks.length);
    if (recalled !== undefined) return { ...recalled.replay, replayed: true };
    const reply = this.buckets.evaluate({ ...request, idempotency: undefined }, now);
    this.#records.keep(idempotency, fingerprint, reply, now, request.dryRun);
    return reply;
  }

  /** Refund at `now` (µs; only expiry and a deadline depend on it), exactly as `lua/refund.lua` would. */
  refund(refund: EncodedRefund, now: number): EncodedRefundReply {
    if (refund.deadline !== undefined && now > refund.deadline)
      return { results: [], recordDeleted: false, late: true };
    const results = refund.checks.map((check, i) => {
      const stored = this.buckets.peek(refund.keys[i]!, now);
      const { next, result } = refundBucket(stored, check);
      // peek hands out the stored object itself: updating it in place is the write.
      if (stored !== undefined && next !== undefined && next !== stored) Object.assign(stored, next);
      return result;
    });
    const recordDeleted = refund.recordKey !== undefined && this.#records.forget(refund.recordKey, now);
    return { results, recordDeleted };
  }
}
