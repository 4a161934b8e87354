/**
 * A decision of the log kinds (sliding_log, concurrency) on a region's store: the region's limit sized from its
 * share by core's `sizedLog` (core/models/sliding-log.ts: floor(capacity × the lowest share of the window), the rule the
 * agent's check router applies), decided by core's `SlidingLogModel` inside the store. Every strategy decides a
 * log this way; only the share differs.
 */
import { kindOf } from '../../core/kinds/index.js';
import type { Policy } from '../../core/policy/policy.js';
import type { RegionalShare } from '../../core/shares/shares.js';
import { sizedLog } from '../../core/models/sliding-log.js';
import type { Outcome } from '../strategy.js';
import { simLogKey, type RegionStore } from './region-store.js';

/** One log decision, with what the agent reports of it. */
export interface LogEvaluation {
  outcome: Outcome;
  /** Units still admissible after it, and the region's limit: the usage report's remaining fraction. */
  remaining: number;
  limit: number;
}

/** Decide `cost` units of `subject` at `now` (µs) on `store` under `share`. */
export function decideLog(
  policy: Policy,
  store: RegionStore,
  subject: number,
  cost: number,
  share: RegionalShare | number,
  now: number,
): LogEvaluation {
  const check = sizedLog(policy, simLogKey(subject), cost, share);
  const result = store.decideLog(subject, check, now);
  const outcome: Outcome = { allowed: result.allowed, retryAfterMs: result.retryAfterMs, decidedAt: now };
  if (result.allowed && kindOf(policy.kind).leases)
    outcome.slot = { store, stamp: result.stamp, seq: result.seq };
  return { outcome, remaining: result.remaining, limit: check.limit };
}
