/** The request's answer from its decided checks: allowed or not, the retry hint, and each check's headers' inputs. */
import type { CheckResult } from '../../core/wire/agent.js';
import { windowSecondsOf } from '../../core/policy/policy.js';
import { CLOSED_REASONS } from './failure-modes.js';
import type { Check } from './check.js';
import type { DecisionOutcome, GlobalBudget, PreparedCheck } from './prepared.js';
import type { ShortfallHandler } from './borrowing-port.js';

/**
 * The request's outcome from every check's result: allowed only when nothing denied; when denied, every result
 * says so, the retry hint is the longest wait of the checks that did not fit (null when one never can), and
 * `unavailable` is true when only failures (store, home region, lease), not quota, denied it. Each check is given
 * its window; with a shortfall handler (borrowing), each borrowing check its global budget, for its headers.
 */
export function summarize(
  checks: Check[],
  allowed: boolean,
  replayed: boolean,
  borrowing?: ShortfallHandler,
): DecisionOutcome {
  let retryAfterMs: number | null = 0;
  let quota = false;
  let unavailable = false;
  const results = new Array<CheckResult>(checks.length);
  for (const c of checks) {
    const p = c.prepared;
    const r = c.result;
    c.window = windowSecondsOf(p.policy);
    if (r === undefined) continue;
    results[c.at] = r;
    if (borrowing !== undefined) c.budget = globalBudget(p, r, c.fits, borrowing);
    if (allowed) continue;
    r.allowed = false;
    if (c.fits) continue;
    // A sharded check that found its sub-bucket empty says so: the others may still hold tokens.
    if (r.reason === undefined && p.policy.shards !== undefined) r.reason = 'shard_exhausted';
    if (r.reason !== undefined && CLOSED_REASONS.has(r.reason)) unavailable = true;
    else quota = true;
    if (retryAfterMs !== null)
      retryAfterMs = r.retryAfterMs === null ? null : Math.max(retryAfterMs, r.retryAfterMs);
  }
  return {
    allowed,
    retryAfterMs: allowed ? 0 : retryAfterMs,
    checks,
    results,
    replayed,
    unavailable: unavailable && !quota,
  };
}

/** Reasons under which a borrowing check's result still describes the subject's own bucket. */
const OWN_BUCKET = new Set<CheckResult['reason']>([undefined, 'subject_exhausted', 'share_exhausted']);

/**
 * The subject's global budget behind a check decided on a bucket that borrows (a regional token bucket, not
 * sharded, not the shared bucket, not a failure mode), or undefined. `borrowable` is asked of the handler only
 * when it matters: the bucket holds less than a token and the check was not just refused after borrowing.
 */
function globalBudget(
  p: PreparedCheck,
  r: CheckResult,
  fit: boolean,
  borrowing: ShortfallHandler | undefined,
): GlobalBudget | undefined {
  if (p.route !== 'store' || p.policy.mode !== 'regional' || p.policy.shards !== undefined) return undefined;
  if (!OWN_BUCKET.has(r.reason)) return undefined;
  const borrowable = fit && r.remaining < 1 && r.reason === undefined && borrowing?.mayLend?.(p) === true;
  return { capacity: p.policy.capacity, refillPerSecond: p.policy.refillPerSecond, borrowable };
}
