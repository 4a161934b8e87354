/**
 * Loans on the wire: an agent whose bucket for a subject ran dry asks the agents of another region (NATS
 * request/reply to that region's queue group, so one of them answers) for that subject's tokens. The lender
 * sizes its own bucket from its own share and policy, takes what it has (core/models/transfer.ts) and answers
 * how many micro-tokens it gave. Shared by both sides; every message is schema-checked on arrival.
 */
import { z } from 'zod';
import { ClassName, MAX_CAPACITY, PolicyName, RegionName } from '../policy/policy.js';
import { MICRO } from '../models/token-bucket.js';
import { KvNamespace } from './kv.js';

/** Subject a region's agents serve loans on, and their queue group. */
export function loanSubject(namespace: string, lender: string): { subject: string; queue: string } {
  const ns = KvNamespace.parse(namespace);
  return { subject: `${ns}.v1.loan.${lender}`, queue: `${ns}-loan-${lender}` };
}

/** Micro-tokens, a whole number: what a loan carries, so no float rounding stands between two buckets. */
const Micros = z
  .number()
  .int()
  .min(1)
  .max(MAX_CAPACITY * MICRO);

/** A loan request. */
export const LoanRequest = z.strictObject({
  fromRegion: RegionName,
  policy: PolicyName,
  /** The policy version the borrower decides under: its bucket keys; a lender on another version refuses. */
  version: z.number().int().positive(),
  /** Already normalized (or hashed) by the borrower. */
  subject: z.string().min(1).max(128),
  /**
   * The subject's class at the borrower (named by its check or by the policy's `subjects`): the lender sizes the
   * subject's bucket by that class's limits, as the borrower does. Absent: the policy's own limits.
   */
  class: ClassName.optional(),
  /**
   * `fill`: give up to `amountMicros` (the borrower's room); `spend`: charge exactly `amountMicros` (the cost of a
   * request the borrower's bucket can never hold) or nothing, and answer whether it was admitted.
   */
  mode: z.enum(['fill', 'spend', 'spare']),
  amountMicros: Micros,
  /** What is left of the borrower's wait when the request leaves, ms. */
  budgetMs: z.number().int().positive().max(60_000),
  /**
   * When the borrower stops waiting, epoch ms of its clock (regions keep clocks within NTP): the lender takes
   * nothing after it (the script refuses to run later), so tokens are not lost to a borrower that gave up.
   */
  deadlineAtMs: z.number().int().positive(),
});
export type LoanRequest = z.infer<typeof LoanRequest>;

/** Error codes a lender may answer with instead of a grant; none of them took anything. */
export const LoanErrorCode = z.enum([
  'invalid_request',
  'unknown_policy',
  /** The lender's policy has another version (other keys, maybe another budget): no transfer between them. */
  'version_mismatch',
  /** The policy is not regional at the lender. */
  'not_regional',
  /** The lender holds no share (no lease): it has nothing to give. */
  'no_share',
  /** The lender's policy defines no such class (a request no agent of this version sends). */
  'unknown_class',
  /** Taken up too late, or the lend ran past the deadline: nothing was taken. */
  'deadline',
  'overloaded',
  /** The lender's store failed: nothing is known to have been taken. */
  'failed',
]);
export type LoanErrorCode = z.infer<typeof LoanErrorCode>;

export const LoanGrant = z.strictObject({
  /** Micro-tokens taken from the lender's bucket for the borrower (`spend`: the cost, charged there, or 0). */
  grantedMicros: z.number().int().min(0),
  /** Micro-tokens left in the lender's bucket. */
  remainingMicros: z.number().int().min(0),
  /** Milliseconds until the lender could grant the amount again; 0 now; null never. */
  refillMs: z.number().int().min(0).nullable(),
});
export type LoanGrant = z.infer<typeof LoanGrant>;

export const LoanReply = z.union([
  LoanGrant,
  z.strictObject({ error: LoanErrorCode, message: z.string().max(300) }),
]);
export type LoanReply = z.infer<typeof LoanReply>;
