import type { CheckResult } from '../../core/agent-wire.js';
import { CLOSED_REASONS } from './failure-modes.js';
import type { DecisionOutcome, DecisionSheet, GlobalBudget, PreparedCheck } from './prepared.js';
import type { ShortfallHandler } from './store-group.js';

/**
 * The request's outcome from every check's result: allowed only when nothing denied; when denied, every result
 * says so, the retry hint is the longest wait of the checks that did not fit (null when one never can), and
 * `unavailable` is true when only failures (store, home region, lease), not quota, denied it. With a shortfall
 * handler (borrowing), each borrowing check's global budget is noted for its headers.
 */
export function summarize(
  checks: readonly PreparedCheck[],
  sheet: DecisionSheet,
  allowed: boolean,
  replayed: boolean,
  borrowing?: ShortfallHandler,
): DecisionOutcome {
  const n = checks.length;
  const { results, fits } = sheet;
  let retryAfterMs: number | null = 0;
  let quota = false;
  let unavailable = false;
  const violated = new Array<boolean>(n);
  const windows = new Array<number>(n);
  const budgets: (GlobalBudget | undefined)[] | undefined = borrowing === undefined ? undefined : [];
  checks.forEach((p, i) => {
    const r = results[i];
    const fit = fits[i] === true;
    windows[i] = Math.ceil(p.policy.capacity / p.policy.refillPerSecond);
    violated[i] = !fit;
    if (budgets !== undefined && r !== undefined) budgets[i] = globalBudget(p, r, fit, borrowing);
    if (allowed || r === undefined) return;
    r.allowed = false;
    if (fit) return;
    // A sharded check that found its sub-bucket empty says so: the others may still hold tokens.
    if (r.reason === undefined && p.policy.shards !== undefined) r.reason = 'shard_exhausted';
    if (r.reason !== undefined && CLOSED_REASONS.has(r.reason)) unavailable = true;
    else quota = true;
    if (retryAfterMs !== null)
      retryAfterMs = r.retryAfterMs === null ? null : Math.max(retryAfterMs, r.retryAfterMs);
  });
  return {
    allowed,
    retryAfterMs: allowed ? 0 : retryAfterMs,
    results,
    replayed,
    violated,
    windows,
    ...(budgets === undefined ? {} : { budgets }),
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
