import { CLOSED_REASONS } from './failure-modes.js';
import type { DecisionOutcome, DecisionSheet, PreparedCheck } from './prepared.js';

/**
 * The request's outcome from every check's result: allowed only when nothing denied; when denied, every result
 * says so, the retry hint is the longest wait of the checks that did not fit (null when one never can), and
 * `unavailable` is true when only failures (store, home region, lease), not quota, denied it.
 */
export function summarize(
  checks: readonly PreparedCheck[],
  sheet: DecisionSheet,
  allowed: boolean,
  replayed: boolean,
): DecisionOutcome {
  const n = checks.length;
  const { results, fits } = sheet;
  let retryAfterMs: number | null = 0;
  let quota = false;
  let unavailable = false;
  const violated = new Array<boolean>(n);
  const windows = new Array<number>(n);
  checks.forEach((p, i) => {
    const r = results[i];
    const fit = fits[i] === true;
    windows[i] = Math.ceil(p.policy.capacity / p.policy.refillPerSecond);
    violated[i] = !fit;
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
    unavailable: unavailable && !quota,
  };
}
