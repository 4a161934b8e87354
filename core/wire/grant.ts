/**
 * The wire of local grants (docs/agent.md, "Local grants"): `POST /v1/grants` takes a small allowance of one
 * subject's tokens out of its bucket for a client to spend in its own process; `POST /v1/grants/return` hands back
 * what it did not spend; `POST /v1/grants/batch` carries many takes and returns in one exchange, each answered on
 * its own (what the client sends). Shared by the agent and the client. Amounts are tokens (micro-token
 * resolution).
 */
import { z } from 'zod';
import { Problem } from './agent.js';
import { ClassName } from '../policy/names.js';
import { MAX_WIRE_POLICY_LENGTH, MAX_WIRE_SUBJECT_LENGTH } from './agent.js';

/** Most tokens one grant may carry, whatever the bucket (the agent also caps a grant at a tenth of it). */
export const MAX_GRANT_TOKENS = 1_000;
/** Longest a grant may be held before its rest must be handed back, ms. */
export const MAX_GRANT_TTL_MS = 5_000;
/** Shortest life a take may ask for, ms. */
export const MIN_GRANT_TTL_MS = 100;
/** Most takes and returns one `POST /v1/grants/batch` may carry, together. */
export const MAX_GRANT_ITEMS_PER_BATCH = 128;

/**
 * A grant's id: 16 random bytes the agent draws at the take (base64url, 22 characters). A return names it; the
 * agent credits at most what that grant took, once. Checked before any store call.
 */
export const GrantId = z.string().regex(/^[A-Za-z0-9_-]{22}$/, 'a grant id is 22 base64url characters');
export type GrantId = z.infer<typeof GrantId>;

const fields = {
  policy: z.string().min(1).max(MAX_WIRE_POLICY_LENGTH),
  subject: z.string().min(1).max(MAX_WIRE_SUBJECT_LENGTH),
  class: ClassName.optional(),
};

/** `POST /v1/grants`: take up to `amount` whole tokens of one subject's bucket. */
export const GrantRequest = z.strictObject({
  ...fields,
  amount: z.number().int().min(1).max(MAX_GRANT_TOKENS),
  /**
   * How long the caller means to hold the grant, ms (MIN_GRANT_TTL_MS..MAX_GRANT_TTL_MS; default 1,000): the
   * answer's `expiresInMs`, and the agent keeps the grant's record for its return twice that long (at least
   * that long plus 1 s: core/models/grant.ts grantRecordTtl).
   */
  ttlMs: z.number().int().min(MIN_GRANT_TTL_MS).max(MAX_GRANT_TTL_MS).optional(),
});
export type GrantRequest = z.infer<typeof GrantRequest>;

/** The answer: what was taken (0 when the bucket is empty or this region cannot decide the subject now). */
export const GrantResponse = z.object({
  policy: z.string(),
  /** Tokens taken out of the bucket for the caller (micro-token resolution; ≤ the amount asked). */
  granted: z.number().min(0),
  /** The bucket's capacity here, whole tokens (the limit a decision would report). */
  limit: z.number().int().min(0),
  /** Whole tokens left in the bucket after the grant. */
  remaining: z.number().int().min(0),
  /** Ms until the bucket could give the amount again (0 now); null when it never will. */
  refillMs: z.number().int().min(0).nullable(),
  /** The caller spends the grant within this many ms, then hands the rest back. */
  expiresInMs: z.number().int().min(1),
  /** The grant's id, to name in its return; null when nothing was granted. */
  grant: GrantId.nullable(),
  /**
   * The largest cost one check of the policy may have (its `maxCost`): a client spends a grant only on checks up
   * to it, so a check the agent would refuse (`AGT_ERR_COST_ABOVE_MAX`) is never admitted on one. Absent from an
   * agent older than this field: the client then spends grants only on checks of cost 1 or less.
   */
  maxCost: z.number().positive().optional(),
});
export type GrantResponse = z.infer<typeof GrantResponse>;

/**
 * `POST /v1/grants/return`: hand back `amount` tokens of grant `grant` that were not spent. At most what that grant
 * took is credited, once; an unknown, expired or already returned grant is refused (404 AGT_ERR_UNKNOWN_GRANT).
 */
export const GrantReturnRequest = z.strictObject({
  ...fields,
  grant: GrantId,
  amount: z.number().min(0.000001).max(MAX_GRANT_TOKENS),
});
export type GrantReturnRequest = z.infer<typeof GrantReturnRequest>;

export const GrantReturnResponse = z.object({
  policy: z.string(),
  /** Tokens put back in the bucket. */
  credited: z.number().min(0),
  /** Tokens that found no room (the bucket refilled meanwhile): gone, never minted. */
  dropped: z.number().min(0),
});
export type GrantReturnResponse = z.infer<typeof GrantReturnResponse>;

/**
 * `POST /v1/grants/batch`: takes and returns of any subjects in one exchange (together at most
 * MAX_GRANT_ITEMS_PER_BATCH, at least one). The returns are handed back first, then the takes are taken, each in
 * the order given, exactly as the single routes would; one item's refusal never fails another's. A body that
 * does not match (any item included) is refused whole (400 `AGT_ERR_INVALID_GRANT`), nothing taken or returned.
 */
export const GrantBatchRequest = z
  .strictObject({
    takes: z.array(GrantRequest).max(MAX_GRANT_ITEMS_PER_BATCH).optional(),
    returns: z.array(GrantReturnRequest).max(MAX_GRANT_ITEMS_PER_BATCH).optional(),
  })
  .refine(
    (b) => {
      const n = (b.takes?.length ?? 0) + (b.returns?.length ?? 0);
      return n >= 1 && n <= MAX_GRANT_ITEMS_PER_BATCH;
    },
    { message: `from 1 to ${MAX_GRANT_ITEMS_PER_BATCH} takes and returns together` },
  );
export type GrantBatchRequest = z.infer<typeof GrantBatchRequest>;

/** One item's answer: the status its single route would have answered with, and that body. */
function answerOf<T extends z.ZodType>(body: T) {
  return z.union([
    z.object({ status: z.literal(200), body }),
    z.object({ status: z.number().int().min(400).max(599), body: Problem }),
  ]);
}
export const GrantTakeAnswer = answerOf(GrantResponse);
export type GrantTakeAnswer = z.infer<typeof GrantTakeAnswer>;
export const GrantReturnAnswer = answerOf(GrantReturnResponse);
export type GrantReturnAnswer = z.infer<typeof GrantReturnAnswer>;

/** The answer of `POST /v1/grants/batch` (200 whenever the batch was well formed): one per item, in order. */
export const GrantBatchResponse = z.object({
  takes: z.array(GrantTakeAnswer),
  returns: z.array(GrantReturnAnswer),
});
export type GrantBatchResponse = z.infer<typeof GrantBatchResponse>;
