/**
 * The wire of direct decisions (docs/agent.md, "Direct decisions"): a client trusted with its region's Redis asks
 * the agent for a short **term** for one policy, `POST /v1/terms`, and decides that policy's single checks itself,
 * with the agent's own bucket script (lua/token_bucket.lua) on the agent's own bucket keys, until the term runs out.
 *
 * A term is a decision that lasts: the agent counts it as a decision in flight under the share it was sized with
 * (ShareView.enter) until it lapses, so the agent acknowledges a shrink of that share only once no client can still
 * decide with the old one (invariant 2, as for every decision; acknowledgements come later by up to a term's
 * length). Its `deadlineMicros` is the same instant in Redis time (converted so that it can only come early): the
 * script refuses a call that runs later, so a call delayed past the term changes nothing. The client stops using
 * a term `validForMs` after it *sent* the request (its own clock, never the agent's), before the agent lets go.
 *
 * Shared by the agent and the client.
 */
import { z } from 'zod';
import { MAX_WIRE_POLICY_LENGTH, MAX_WIRE_SUBJECT_LENGTH } from './agent.js';
import { DEFAULT_RATE_LIMIT_DRAFT, RATE_LIMIT_DRAFTS } from './rate-limit-headers.js';
import { subjectFingerprint } from '../subjects/subject.js';

/**
 * Longest term an agent gives, ms (`QP_TERM_MS` is bounded by it). Every shrink waits for the last term of the old
 * record, and the coordinator gives a region about 3 s (with its default settings) to acknowledge one before it
 * refuses its renewal: terms stay well inside that.
 */
export const MAX_TERM_MS = 2_000;
/** The fingerprint of an HMAC secret a term names: the secret's HMAC of a fixed label, 12 characters. */
export function termKeyFingerprint(hmacSecret: string): string {
  return subjectFingerprint('quotaplane:term-key', hmacSecret);
}

/** Shortest term an agent gives, ms: shorter than this, renewals would cost more than the decisions they save. */
export const MIN_TERM_MS = 200;
/** The agent's term length by default, ms. */
export const DEFAULT_TERM_MS = 1_000;
/** Most subjects one term may name as decided by the agent only (`exclude`); a policy with more gives no terms. */
export const MAX_TERM_EXCLUDED = 1_024;
/** Most subjects one renewal may report usage for. */
export const MAX_TERM_USAGE = 1_024;

/**
 * What a client decided under its last term of the policy, for one subject: whole tokens admitted and refused.
 * The agent counts them as the usage its own decisions report (demand the coordinator moves shares by).
 */
export const TermUsage = z.tuple([
  z.string().min(1).max(MAX_WIRE_SUBJECT_LENGTH),
  z.number().int().min(0).max(1e9),
  z.number().int().min(0).max(1e9),
]);
export type TermUsage = z.infer<typeof TermUsage>;

/** `POST /v1/terms`: a term for one policy, and what the previous one decided. */
export const TermRequest = z.strictObject({
  policy: z.string().min(1).max(MAX_WIRE_POLICY_LENGTH),
  /** Send the bucket script's source too (a client's first term, or after Redis lost its script cache). */
  script: z.boolean().optional(),
  usage: z.array(TermUsage).max(MAX_TERM_USAGE).optional(),
});
export type TermRequest = z.infer<typeof TermRequest>;

const whole = z.number().int().min(0);

/** The bucket every direct check of the term is decided on (core/wire/bucket.ts BucketCheck, without key and cost). */
export const TermBucket = z.object({
  /** Tokens (micro-token resolution): the region's share of the policy's burst. */
  capacity: z.number().min(0),
  /** Tokens per second: the region's share of the policy's refill. */
  refillPerSecond: z.number().min(0),
  /** Idle TTL of a bucket key, ms. */
  ttlMs: z.number().int().min(1),
  /** The share's rate-history floor (core/shares/share-sizing.ts), as the script takes it. */
  floor: z
    .object({
      beforeMicros: whole,
      capacity: z.number().min(0),
      refillPerSecond: z.number().min(0),
    })
    .optional(),
});
export type TermBucket = z.infer<typeof TermBucket>;

/** The answer of `POST /v1/terms`. */
export const TermResponse = z.object({
  policy: z.string(),
  /** The policy's version: bucket keys are `rl:v<version>:{<subject>}:<policy>` (core/keys.ts bucketKey). */
  version: z.number().int().min(0),
  /** The lease epoch the share belongs to (0 without a coordinator); for logs. */
  epoch: z.number().int().min(0),
  bucket: TermBucket,
  /** The region's capacity, whole tokens: a decision's `limit`. */
  limit: whole,
  /** Seconds to refill from empty: the policy's window, for `RateLimit-Policy`. */
  window: whole,
  /** The policy's mode as a decision reports it. */
  mode: z.enum(['regional', 'local']),
  /** Most tokens one check of the policy may cost (`maxCost`); a costlier check goes to the agent, which refuses it. */
  maxCost: z.number().min(0).optional(),
  /** The reason a refusal for want of tokens carries (what the agent would say: `subject_exhausted` or `share_exhausted`). */
  refusedReason: z.enum(['subject_exhausted', 'share_exhausted']).optional(),
  /** The term may be used for this long after the client sent its request, ms. */
  validForMs: z.number().int().min(1).max(MAX_TERM_MS),
  /** The same end in Redis TIME µs: every script call under the term carries it (it can only come early). */
  deadlineMicros: z.number().int().min(1),
  /**
   * `final`: a refusal of the term's bucket is the answer (nothing else could cover it here). `agent`: send a
   * refused check to the agent, which may cover it from another region (borrowing).
   */
  refusals: z.enum(['final', 'agent']),
  /**
   * With `refusals: 'agent'` (the bucket borrows): the subject's global budget, which headers then describe
   * (core/wire/rate-limit-headers.ts; the client cannot tell whether borrowing could still fetch a token, so it
   * advertises what the bucket holds).
   */
  budget: z.object({ capacity: z.number().min(0), refillPerSecond: z.number().min(0) }).optional(),
  /** Subjects decided by the agent only (an override share, a class given by subject). */
  exclude: z.array(z.string()).max(MAX_TERM_EXCLUDED),
  /**
   * Set when the agent keys subjects with an HMAC secret (`QP_HMAC_SECRET`): a fingerprint of that secret
   * (core/wire/term.ts termKeyFingerprint). The client decides directly only with the same secret (its own option:
   * the secret never travels), hashing each subject as the agent does.
   */
  hashed: z.object({ fingerprint: z.string().min(1).max(64) }).optional(),
  /** How the agent writes rate-limit headers (core/wire/rate-limit-headers.ts). */
  headers: z.object({
    draft: z.enum(RATE_LIMIT_DRAFTS).default(DEFAULT_RATE_LIMIT_DRAFT),
    legacy: z.boolean(),
  }),
  /** SHA1 of the bucket script (EVALSHA); `script` holds its source when it was asked for. */
  scriptSha: z.string().regex(/^[0-9a-f]{40}$/),
  script: z.string().optional(),
  /**
   * SHA1 of the refund script (lua/refund.lua), which hands back tokens a client took ahead and did not spend
   * (clamped to the bucket's capacity: it cannot mint); `refundScript` holds its source when `script` was asked
   * for. A client takes no tokens ahead under a term without it (an agent from before takes were handed back).
   */
  refundSha: z
    .string()
    .regex(/^[0-9a-f]{40}$/)
    .optional(),
  refundScript: z.string().optional(),
});
export type TermResponse = z.infer<typeof TermResponse>;
