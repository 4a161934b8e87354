/**
 * One check on its way through the decision path: the object every step of one decision reads and writes, from
 * the routed check to its answer. The layered runner makes one per check of a request (`newCheck`); a failure
 * mode, a store group or the home region writes its result and whether its cost fit; a group that charged writes
 * its charge, which a later denial refunds and an admitted reservation keeps; `summarize` (outcome.ts) adds its
 * window and global budget, and the request's answer carries it.
 */
import type { CheckResult } from '../../core/wire/agent.js';
import type { BucketCheck } from '../../core/wire/bucket.js';
import type { Charge } from '../../core/models/reservation.js';
import type { GlobalBudget, PreparedCheck } from './prepared.js';

export interface Check<P extends PreparedCheck = PreparedCheck> {
  /** Position in the request: the answer lists results in this order. */
  readonly at: number;
  /**
   * The check as routed: policy, subject, cost, and who decides it against what. A new subject past its policy's
   * creation cap (flood answer `shared`) is routed again, onto the policy's shared bucket, which replaces it.
   */
  prepared: P;
  /** What was decided; undefined until a step decides it. */
  result: CheckResult | undefined;
  /** Whether its cost fit. False: the request is refused for it (it is a violated policy). */
  fits: boolean;
  /**
   * What deciding it charged in this region's store (a bucket's cost, a day's units, a log's entries), set when
   * its group charged (a replay included); undefined when nothing was charged here (dry runs, looks, failure
   * modes, forwarded checks). A later denial refunds it; an admitted reservation records it.
   */
  charge: Charge | undefined;
  /**
   * What its policy's emergency bucket was charged (`onStoreFailure: local`, the store failed): given back when
   * the request is refused after all (failure-modes.ts `refund`).
   */
  emergency: BucketCheck | undefined;
  /** The policy's window (seconds to refill from empty), for RateLimit-Policy; set when the request is answered. */
  window: number;
  /**
   * The subject's global budget, which its rate-limit headers describe instead of this region's part, when the
   * check borrows (a regional token bucket with borrowing on); set when the request is answered.
   */
  budget: GlobalBudget | undefined;
}

/** A check routed as `prepared`, at position `at` of its request: nothing decided yet, fitting until told otherwise. */
export function newCheck<P extends PreparedCheck>(prepared: P, at: number): Check<P> {
  // Every field set here, in one order: one shape for every check keeps the code that reads them monomorphic.
  return {
    at,
    prepared,
    result: undefined,
    fits: true,
    charge: undefined,
    emergency: undefined,
    window: 0,
    budget: undefined,
  };
}
