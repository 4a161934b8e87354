/**
 * The decision path's port to borrowing: what a store group (store-group.ts) and the outcome's headers
 * (outcome.ts) ask of whatever brings this region tokens from other regions, in the decision path's own terms.
 * `regional-agent/borrowing/borrower.ts` implements it and imports nothing else of the decision path; an agent
 * without borrowing (`QP_BORROWING=false`, no coordinator) passes none, and regional refusals are final.
 */
import type { DecisionReason } from '../../core/wire/agent.js';
import { kindOf } from '../../core/kinds/index.js';
import type { StoreCheck } from './prepared.js';

/** What borrowing is told of a check: its policy (as its subject's class sees it), its subject and its bucket. */
export type BorrowingCheck = Pick<StoreCheck, 'policy' | 'subject' | 'subjectClass' | 'bucket'>;

/** A regional check refused for lack of this region's tokens, with what its bucket held. */
export interface ShortCheck {
  check: BorrowingCheck;
  /** Tokens the bucket held when it refused (before the request). */
  remaining: number;
  /**
   * The handler's credit generation of the check's subject when the decision was asked for
   * (ShortfallHandler.generation): a credit since makes `remaining` stale.
   */
  generation?: number | undefined;
}

/** What a shortfall handler did about the short checks of a group. */
export interface ShortfallOutcome {
  /** True when tokens were added for every short check: the group is decided once more. */
  covered: boolean;
  /**
   * True when the handler only waited for a top-up of these subjects (what the refusal saw of its buckets is
   * stale): the group is decided again, and this does not count as one of its MAX_COVER_ATTEMPTS.
   */
  waited?: boolean;
  /**
   * Per short check (same order), why it may still be refused: `subject_exhausted` (every other region is dry:
   * the subject used its global budget) or `share_exhausted` (budget may be left elsewhere but could not be
   * had in time); undefined for a check that was covered.
   */
  reasons: (DecisionReason | undefined)[];
}

/**
 * The one place a refusal for lack of local tokens can be intercepted: a regional check whose bucket could take
 * its cost once refilled (`retryAfterMs > 0`), in a charging call. A handler that brings tokens into those
 * buckets (borrowing them from other regions) says so, and the group is decided once more; a refusal after that
 * carries the handler's reason.
 */
export interface ShortfallHandler {
  cover(short: readonly ShortCheck[], deadlineAt: number): Promise<ShortfallOutcome>;
  /**
   * A charging decision admitted these regional checks and left `remaining` tokens in their buckets: the
   * handler may top a bucket up ahead of need (off the request path; it never delays the answer).
   */
  admitted?(checks: readonly ShortCheck[]): void;
  /** A number that changes whenever tokens are credited to (policy, subject)'s bucket here. */
  generation?(policy: string, subject: string): number;
  /**
   * Whether borrowing could fetch a token for `check`'s subject now: some other region holding a share of it is
   * neither known dry nor backed off (what the next refusal's borrow would ask). Read only, for headers.
   */
  mayLend?(check: BorrowingCheck): boolean;
}

/**
 * Times a group may be covered and decided again: a borrow can be raced away by concurrent decisions of the
 * same subject, which then borrow once more (together: borrows are single-flight per subject).
 */
export const MAX_COVER_ATTEMPTS = 3;
/** Times a group may wait for top-ups of its subjects and be decided again, on top of its cover attempts. */
export const MAX_COVER_WAITS = 4;

/**
 * Whether a check's bucket may borrow from (and be topped up by) other regions: regional checks, except sharded
 * ones. A sharded check's bucket is one of K sub-buckets holding C·s/K; a loan names the subject and the policy,
 * and a lender sizes and takes from the subject's whole (unsharded) bucket, a key no sharded decision uses, which
 * its script treats as full: every borrow would mint up to C·s. Sharded checks are refused `shard_exhausted`
 * instead (docs/sharded-keys.md), and lenders refuse sharded loans (core/borrowing/lender.ts acceptLoan).
 */
export function borrows(check: BorrowingCheck): boolean {
  return (
    kindOf(check.policy.kind).borrows && check.policy.mode === 'regional' && check.policy.shards === undefined
  );
}
