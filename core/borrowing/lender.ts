/**
 * Both ends of one loan, pure: what a lender does with a loan request before and after its store takes the
 * tokens, and what its reply teaches the borrower. The agent (over NATS and Redis) and the simulator (over its
 * network and in-memory buckets) call these, so a loan means the same thing in both.
 */
import { kindOf } from '../kinds/index.js';
import { hasOwnKey } from '../own-keys.js';
import { withClass, type Policy } from '../policy/policy.js';
import { sizedBucket } from '../shares/share-sizing.js';
import type { RegionalShare } from '../shares/shares.js';
import type { LoanErrorCode, LoanReply, LoanRequest } from '../wire/loan.js';
import type { LoanAnswer } from './planner.js';
import { transferBucket, type EncodedLend, type EncodedLendResult } from '../models/transfer.js';

/** Time kept for a lender's answer to travel back to the borrower, ms (at most a quarter of its budget). */
export const LEND_RETURN_MS = 50;

/**
 * Epoch ms after which a lender takes nothing for `request`: the answer must still reach the borrower before it
 * stops waiting (a grant it no longer waits for is lost: safe, but lost).
 */
export function lendBy(request: Pick<LoanRequest, 'deadlineAtMs' | 'budgetMs'>): number {
  return request.deadlineAtMs - Math.min(LEND_RETURN_MS, request.budgetMs / 4);
}

/** A refusal a lender answers with: nothing was taken. */
export interface LendRefusal {
  error: LoanErrorCode;
  message: string;
}

/**
 * Whether a lender may lend for `request` before it looks at its share: `{ policy }` when it may, as the subject
 * sees it (its class's limits when the request names one, so the lend is sized as the borrower's bucket is); a
 * refusal when the request was taken up too late by its clock (epoch ms), or the policy is unknown here
 * (undefined), not regional, of another version, or without the class.
 */
export function acceptLoan(
  request: LoanRequest,
  policy: Policy | undefined,
  now: number,
): { policy: Policy } | LendRefusal {
  if (now >= lendBy(request))
    return { error: 'deadline', message: 'taken up after the borrower stopped waiting' };
  if (policy === undefined) return { error: 'unknown_policy', message: `unknown policy ${request.policy}` };
  if (policy.mode !== 'regional')
    return { error: 'not_regional', message: `${policy.name} is not a regional policy` };
  // A kind that does not borrow (a counter: core/kinds/) has no token bucket a lend could take from: its subject's
  // bucket key is one no decision uses, which reads as full, so lending from it would mint tokens.
  if (!kindOf(policy.kind).borrows)
    return {
      error: 'not_regional',
      message: `${policy.name} is a ${policy.kind} policy: it neither lends nor borrows`,
    };
  // A sharded policy's buckets are sub-buckets of C/K; the subject's whole bucket, which a lend would take from,
  // is a key no decision uses (and so reads as full): nothing there is the subject's to give.
  if (policy.shards !== undefined)
    return {
      error: 'not_regional',
      message: `${policy.name} is sharded: its sub-buckets neither lend nor borrow`,
    };
  if (policy.version !== request.version) {
    return {
      error: 'version_mismatch',
      message: `${policy.name} is at version ${policy.version} here, ${request.version} there`,
    };
  }
  if (request.class === undefined) return { policy };
  if (!hasOwnKey(policy.classes, request.class))
    return { error: 'unknown_class', message: `${policy.name} has no class ${request.class} here` };
  return { policy: withClass(policy, request.class) };
}

/**
 * What to take for `request` from the lender's bucket at `key`, sized by the lender's own share of the subject
 * (undefined: it holds none and refuses).
 */
export function sizeLend(
  request: LoanRequest,
  policy: Policy,
  share: RegionalShare | number | undefined,
  key: string,
): { lend: EncodedLend } | LendRefusal {
  if (share === undefined) return { error: 'no_share', message: 'this region holds no share of it' };
  const { cost: _cost, ...bucket } = sizedBucket(policy, key, 1, share);
  return { lend: { key, bucket: transferBucket(bucket), mode: request.mode, amount: request.amountMicros } };
}

/** The reply of a lend the store ran. */
export function grantReply(result: EncodedLendResult): LoanReply {
  return {
    grantedMicros: result.granted,
    remainingMicros: Math.max(0, result.remaining),
    refillMs: result.refillMs < 0 ? null : result.refillMs,
  };
}

/** Refusals that say the lender has nothing for this subject (the planner remembers it dry for a while). */
const DRY_REFUSALS: ReadonlySet<LoanErrorCode> = new Set([
  'invalid_request',
  'unknown_policy',
  'version_mismatch',
  'not_regional',
  'no_share',
  'unknown_class',
]);

/**
 * What a lender's reply, received `rttMs` after the request left, teaches the borrower: a grant; `refused` when
 * it has nothing for this subject; `late` when it took the request up after the borrower's deadline (nothing
 * was taken, nothing learnt); `unreachable` for a busy or failing lender (the region is backed off).
 */
export function loanAnswer(reply: LoanReply, rttMs?: number): LoanAnswer {
  if (!('error' in reply)) return { kind: 'grant', grant: reply, rttMs };
  if (DRY_REFUSALS.has(reply.error)) return { kind: 'refused', rttMs };
  if (reply.error === 'deadline') return { kind: 'late' };
  return { kind: 'unreachable' };
}
