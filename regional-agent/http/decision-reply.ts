import { wireCheckResult, type DecisionResponse } from '../../core/wire/agent.js';
import type { DecisionOutcome } from '../decisions/decision-service.js';
import {
  DEFAULT_RATE_LIMIT_DRAFT,
  rateLimitHeaders,
  type RateLimitDraft,
} from '../../core/wire/rate-limit-headers.js';

/** The wire form of a decision, headers included. */
export function decisionResponse(
  outcome: DecisionOutcome,
  legacyHeaders: boolean,
  draft: RateLimitDraft = DEFAULT_RATE_LIMIT_DRAFT,
): DecisionResponse {
  const response: DecisionResponse = {
    allowed: outcome.allowed,
    retryAfterMs: outcome.retryAfterMs,
    results: outcome.results.map(wireCheckResult),
    headers: decisionHeaders(outcome, legacyHeaders, draft),
  };
  if (outcome.replayed) response.replayed = true;
  return response;
}

/** The rate-limit headers of a decision (`RateLimit-Policy`, `RateLimit`, `Retry-After`, legacy ones). */
export function decisionHeaders(
  outcome: DecisionOutcome,
  legacyHeaders: boolean,
  draft: RateLimitDraft = DEFAULT_RATE_LIMIT_DRAFT,
): Record<string, string> {
  const inputs = outcome.results.map((result, i) => {
    const check = outcome.checks[i]!;
    return { result, windowSeconds: check.window, violated: !check.fits, budget: check.budget };
  });
  return rateLimitHeaders(outcome.allowed, inputs, legacyHeaders, draft);
}

/** Names of the policies a denied decision violated, without repeats. */
export function violatedPolicies(outcome: DecisionOutcome): string[] {
  const names = new Set<string>();
  outcome.results.forEach((r, i) => {
    if (outcome.checks[i]?.fits === false) names.add(r.policy);
  });
  return [...names];
}
