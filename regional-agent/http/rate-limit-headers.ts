/**
 * Response headers of a decision, per draft-ietf-httpapi-ratelimit-headers-10:
 *   RateLimit-Policy: "name";q=LIMIT;w=WINDOW      (every policy checked)
 *   RateLimit: "name";r=REMAINING;t=SECONDS        (allowed: every policy, t = seconds until full;
 *                                                   denied: the violated policies, t = seconds until the cost fits)
 *   Retry-After: SECONDS                           (denied: whole seconds rounded up, never before any t listed)
 * and, when configured, the legacy X-RateLimit-Limit / -Remaining / -Reset of the most constrained policy.
 */
import type { CheckResult } from '../../core/agent-wire.js';

/** What headers need to know of one check beside its result. */
export interface HeaderInput {
  result: CheckResult;
  /** Seconds to refill from empty: the policy's window. */
  windowSeconds: number;
  /** True when this check did not fit (it is why the request was denied). */
  violated: boolean;
}

const seconds = (ms: number) => Math.ceil(ms / 1000);

/** The headers of one decision; keys are the canonical header names. */
export function rateLimitHeaders(
  allowed: boolean,
  inputs: readonly HeaderInput[],
  legacy: boolean,
): Record<string, string> {
  const policies: string[] = [];
  const limits: string[] = [];
  let retryAfter = 0;
  let never = false;
  let constrained: HeaderInput | undefined;
  let constrainedT = 0;
  for (const input of inputs) {
    const r = input.result;
    policies.push(`"${r.policy}";q=${Math.floor(r.limit)};w=${input.windowSeconds}`);
    if (!allowed && !input.violated) continue;
    // Allowed: t is when the bucket is full again. Denied: t is when this check's cost fits, which is what
    // Retry-After is made of; a cost that can never fit has no t and suppresses Retry-After.
    const wait = allowed ? r.resetMs : r.retryAfterMs;
    const t = wait === null ? undefined : seconds(wait);
    limits.push(`"${r.policy}";r=${Math.max(0, Math.floor(r.remaining))}${t === undefined ? '' : `;t=${t}`}`);
    if (!allowed) {
      if (t === undefined) never = true;
      else retryAfter = Math.max(retryAfter, t);
    }
    const tighter = allowed
      ? constrained === undefined || ratio(r) < ratio(constrained.result)
      : (t ?? Infinity) > constrainedT || constrained === undefined;
    if (tighter) {
      constrained = input;
      constrainedT = t ?? 0;
    }
  }
  const headers: Record<string, string> = {
    'RateLimit-Policy': policies.join(', '),
    RateLimit: limits.join(', '),
  };
  if (!allowed && !never) headers['Retry-After'] = String(retryAfter);
  if (legacy && constrained !== undefined) {
    headers['X-RateLimit-Limit'] = String(Math.floor(constrained.result.limit));
    headers['X-RateLimit-Remaining'] = String(Math.max(0, Math.floor(constrained.result.remaining)));
    headers['X-RateLimit-Reset'] = String(constrainedT);
  }
  return headers;
}

function ratio(r: CheckResult): number {
  return r.limit > 0 ? r.remaining / r.limit : 0;
}
