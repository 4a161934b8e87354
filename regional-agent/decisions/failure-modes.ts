/** What a policy's failure mode answers for a check nothing could decide (no store answer, home or lease). */
import { DAY_MICRO } from '../../core/models/daily-budget.js';
import type { CheckResult, DecisionReason, DegradedCause } from '../../core/wire/agent.js';
import type { BucketCheck } from '../../core/wire/bucket.js';
import type { EmergencyBuckets } from './emergency-buckets.js';
import type { Check } from './check.js';
import type { PreparedCheck } from './prepared.js';

/** Reasons of a fail-closed denial: the decision could not be made, it was not refused for quota. */
export const CLOSED_REASONS: ReadonlySet<string> = new Set([
  'store_unavailable',
  'home_unreachable',
  'no_lease',
]);

/**
 * What each policy does when nothing could decide its check (no store answer, no home region, no lease):
 * `closed` denies with the failure's reason, `open` admits (counted), `local` decides from a small in-process
 * emergency bucket sized from the check's own bucket.
 */
export class FailureModes {
  readonly #emergency: EmergencyBuckets;
  /** Retry hint of a fail-closed denial (the breaker's reset time). */
  readonly #retryAfterMs: number;

  constructor(emergency: EmergencyBuckets, failureRetryAfterMs: number) {
    this.#emergency = emergency;
    this.#retryAfterMs = failureRetryAfterMs;
  }

  /**
   * A group of checks got no answer for `cause`: each is answered by its policy's failure mode. The `local`
   * checks of one group share one emergency decision, all-or-nothing as the store would have. Returns false when
   * some check does not fit.
   */
  failAll(checks: readonly Check[], cause: DegradedCause, dryRun: boolean): boolean {
    let allowed = true;
    const local: { check: Check; bucket: BucketCheck }[] = [];
    for (const c of checks) {
      const p = c.prepared;
      if (p.policy.onStoreFailure === 'local' && p.bucket !== undefined) {
        local.push({ check: c, bucket: p.bucket });
        continue;
      }
      if (!this.fail(c, cause, dryRun)) allowed = false;
    }
    if (local.length > 0) {
      const sized = local.map((l) => this.#emergency.size(l.check.prepared.policy, l.bucket));
      // All-or-nothing with the group's other checks: one that failed closed leaves the emergency buckets as they
      // were (a look, for the numbers).
      const look = dryRun || !allowed;
      const decision = this.#emergency.decide(sized, look);
      local.forEach((l, j) => {
        const c = l.check;
        const b = decision?.results[j];
        const capacity = sized[j]?.capacity ?? 0;
        if (decision === undefined || b === undefined) {
          c.result = this.closed(c.prepared, 'emergency_full');
          c.fits = false;
          allowed = false;
          return;
        }
        c.result = emergencyResult(c.prepared, decision.allowed, b, capacity, cause);
        c.fits = b.retryAfterMs === 0;
        if (!decision.allowed) allowed = false;
        else if (!look) c.emergency = sized[j];
      });
    }
    return allowed;
  }

  /** Answer one check that nothing could decide by its policy's failure mode. Returns whether its cost fit. */
  fail(c: Check, cause: DegradedCause, dryRun: boolean): boolean {
    const p = c.prepared;
    const mode = p.policy.onStoreFailure;
    if (mode === 'open') {
      c.result = {
        policy: p.policy.name,
        allowed: true,
        remaining: 0,
        limit: limitOf(p),
        resetMs: null,
        retryAfterMs: 0,
        mode: p.policy.mode,
        reason: 'fail_open',
        cause,
      };
      c.fits = true;
      return true;
    }
    // Without a share (no lease) or a home region there is nothing to size an emergency bucket from.
    if (mode === 'local' && p.bucket !== undefined) {
      const sized = this.#emergency.size(p.policy, p.bucket);
      const decision = this.#emergency.decide([sized], dryRun);
      const b = decision?.results[0];
      if (decision === undefined || b === undefined) {
        c.result = this.closed(p, 'emergency_full');
        c.fits = false;
        return false;
      }
      c.result = emergencyResult(p, decision.allowed, b, sized.capacity, cause);
      c.fits = b.retryAfterMs === 0;
      if (decision.allowed && !dryRun) c.emergency = sized;
      return c.fits;
    }
    c.result = this.closed(p, cause);
    c.fits = false;
    return false;
  }

  /**
   * Give back what the emergency buckets were charged for `checks` (their request was refused by another check):
   * no grant survives a denial, in the emergency buckets as in the store.
   */
  refund(checks: readonly Check[]): void {
    const charged = checks.filter((c) => c.emergency !== undefined);
    if (charged.length === 0) return;
    this.#emergency.refund(charged.map((c) => c.emergency!));
    for (const c of charged) {
      if (c.result !== undefined)
        c.result.remaining = Math.min(c.result.remaining + c.emergency!.cost, c.result.limit);
      c.emergency = undefined;
    }
  }

  /** A fail-closed denial for `cause`. */
  closed(p: PreparedCheck, cause: DegradedCause): CheckResult {
    const reason: DecisionReason = cause === 'emergency_full' ? 'store_unavailable' : cause;
    const result: CheckResult = {
      policy: p.policy.name,
      allowed: false,
      remaining: 0,
      limit: limitOf(p),
      resetMs: null,
      retryAfterMs: this.#retryAfterMs,
      mode: p.policy.mode,
      reason,
    };
    if (cause !== reason) result.cause = cause;
    return result;
  }
}

function emergencyResult(
  p: PreparedCheck,
  allowed: boolean,
  b: { remaining: number; resetMs: number | null; retryAfterMs: number | null },
  capacity: number,
  cause: DegradedCause,
): CheckResult {
  return {
    policy: p.policy.name,
    allowed,
    remaining: b.remaining > 0 ? b.remaining : 0,
    limit: capacity,
    resetMs: b.resetMs,
    retryAfterMs: b.retryAfterMs,
    mode: p.policy.mode,
    reason: 'emergency_bucket',
    cause,
  };
}

/** The limit a check's result reports when a failure mode decides it: its bucket's, log's or day's. */
function limitOf(p: PreparedCheck): number {
  if (p.bucket !== undefined) return p.bucket.capacity;
  if (p.log !== undefined) return p.log.limit;
  return p.day === undefined ? 0 : p.day.limit / DAY_MICRO;
}
