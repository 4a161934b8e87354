/**
 * Response headers of a decision, per draft-ietf-httpapi-ratelimit-headers-11 (the default) or -10
 * (`QP_RATE_LIMIT_HEADERS`), docs/agent.md "Headers":
 *   RateLimit-Policy: "name";q=QUOTA;w=WINDOW      (every policy checked, both drafts)
 *   RateLimit: "name";r=REMAINING;t=SECONDS
 *     -11: every policy checked, allowed or denied; r the quota available, t the seconds until it is restored.
 *     -10: allowed: every policy, t = seconds until full; denied: the violated policies, t = seconds until the
 *          cost fits.
 *   Retry-After: SECONDS                           (denied: whole seconds rounded up until every violated cost
 *                                                   fits; -10: the largest t listed)
 * and, when configured, the legacy X-RateLimit-Limit / -Remaining / -Reset: the q, r and t of the most
 * constrained policy, as listed.
 *
 * What the numbers mean: a check whose bucket borrows (a regional policy with borrowing on) describes the
 * subject's budget in this deployment, not the region's slice of it: q is the policy's global capacity, r what
 * this region holds, at least 1 while borrowing could still fetch a token (so r=0 never precedes an admission of
 * cost 1), t derived from the policy's refill (ceil((q − r) / refillPerSecond)), never from the region's share.
 * Every other check describes its bucket as it is (its capacity, its tokens, its reset).
 */
import type { CheckResult } from './agent.js';

/** The subject's budget behind a check whose bucket borrows (regional-agent/decisions/prepared.ts has its source). */
export interface GlobalBudget {
  /** The policy's capacity as the subject sees it (its class's), tokens. */
  capacity: number;
  /** The policy's refill as the subject sees it, tokens per second. */
  refillPerSecond: number;
  /** Borrowing could still fetch a token for this subject now (some other region is neither dry nor away). */
  borrowable: boolean;
}

/** Which revision of draft-ietf-httpapi-ratelimit-headers the headers follow. */
export const RATE_LIMIT_DRAFTS = ['draft-11', 'draft-10'] as const;
export type RateLimitDraft = (typeof RATE_LIMIT_DRAFTS)[number];
export const DEFAULT_RATE_LIMIT_DRAFT: RateLimitDraft = 'draft-11';

/** What headers need to know of one check beside its result. */
export interface HeaderInput {
  result: CheckResult;
  /** Seconds to refill from empty: the policy's window. */
  windowSeconds: number;
  /** True when this check did not fit (it is why the request was denied). */
  violated: boolean;
  /** Set when the check borrows: the numbers then describe the subject's global budget. */
  budget?: GlobalBudget | undefined;
}

/** The q, r and t one check advertises. */
export interface AdvertisedQuota {
  /** Quota: whole tokens. */
  q: number;
  /** Remaining: whole tokens, 0 ≤ r ≤ q. */
  r: number;
  /** Seconds until the quota is restored (bucket full again), whole, rounded up; null when it never will be. */
  restoreSeconds: number | null;
}

const seconds = (ms: number) => Math.ceil(ms / 1000);

/** What one check advertises: integers only, from the subject's budget when it borrows. */
export function advertisedQuota(input: HeaderInput): AdvertisedQuota {
  const { result, budget } = input;
  const held = result.remaining > 0 ? Math.floor(result.remaining) : 0;
  if (budget === undefined || !(budget.refillPerSecond > 0)) {
    const q = result.limit > 0 ? Math.floor(result.limit) : 0;
    return { q, r: held, restoreSeconds: result.resetMs === null ? null : seconds(result.resetMs) };
  }
  const q = Math.max(0, Math.floor(budget.capacity));
  // A violated check was just refused, borrowing included: what it holds is all it can say.
  const r = Math.min(q, budget.borrowable && !input.violated ? Math.max(held, 1) : held);
  return { q, r, restoreSeconds: Math.ceil((q - r) / budget.refillPerSecond) };
}

/** The headers of one decision; keys are the canonical header names. */
export function rateLimitHeaders(
  allowed: boolean,
  inputs: readonly HeaderInput[],
  legacy: boolean,
  draft: RateLimitDraft = DEFAULT_RATE_LIMIT_DRAFT,
): Record<string, string> {
  const policies: string[] = [];
  const limits: string[] = [];
  let retryAfter = 0;
  let never = false;
  let constrained: { q: number; r: number; t: number; wait: number } | undefined;
  for (const input of inputs) {
    const res = input.result;
    const { q, r, restoreSeconds } = advertisedQuota(input);
    policies.push(`"${res.policy}";q=${q};w=${input.windowSeconds}`);
    // Denied: when this check's cost fits (what Retry-After is made of); a cost that can never fit has no wait and
    // suppresses Retry-After.
    const fitsIn = res.retryAfterMs === null ? undefined : seconds(res.retryAfterMs);
    if (!allowed && input.violated) {
      if (fitsIn === undefined) never = true;
      else retryAfter = Math.max(retryAfter, fitsIn);
    }
    if (draft === 'draft-10' && !allowed && !input.violated) continue;
    // -10 lists a violated check's wait for its cost as t; otherwise (and always in -11) t is the restore time.
    const t = draft === 'draft-10' && !allowed ? fitsIn : (restoreSeconds ?? undefined);
    limits.push(`"${res.policy}";r=${r}${t === undefined ? '' : `;t=${t}`}`);
    // The most constrained: allowed, the lowest r / q; denied, the violated check that waits longest.
    if (!allowed && !input.violated) continue;
    const wait = allowed ? (q > 0 ? r / q : 0) : (fitsIn ?? Infinity);
    const tighter =
      constrained === undefined || (allowed ? wait < constrained.wait : wait > constrained.wait);
    if (tighter) constrained = { q, r, t: t ?? 0, wait };
  }
  const headers: Record<string, string> = {
    'RateLimit-Policy': policies.join(', '),
    RateLimit: limits.join(', '),
  };
  if (!allowed && !never) headers['Retry-After'] = String(retryAfter);
  if (legacy && constrained !== undefined) {
    headers['X-RateLimit-Limit'] = String(constrained.q);
    headers['X-RateLimit-Remaining'] = String(constrained.r);
    headers['X-RateLimit-Reset'] = String(constrained.t);
  }
  return headers;
}
