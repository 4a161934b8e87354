import { wireCheckResult, type DecisionResponse } from '../../core/agent-wire.js';
import type { DecisionOutcome } from '../decisions/decision-service.js';
import { rateLimitHeaders } from './rate-limit-headers.js';

/** The wire form of a decision, headers included. */
export function decisionResponse(outcome: DecisionOutcome, legacyHeaders: boolean): DecisionResponse {
  const response: DecisionResponse = {
    allowed: outcome.allowed,
    retryAfterMs: outcome.retryAfterMs,
    results: outcome.results.map(wireCheckResult),
    headers: decisionHeaders(outcome, legacyHeaders),
  };
  if (outcome.replayed) response.replayed = true;
  return response;
}

/** The rate-limit headers of a decision (`RateLimit-Policy`, `RateLimit`, `Retry-After`, legacy ones). */
export function decisionHeaders(outcome: DecisionOutcome, legacyHeaders: boolean): Record<string, string> {
  const inputs = outcome.results.map((result, i) => ({
    result,
    windowSeconds: outcome.windows[i]!,
    violated: outcome.violated[i]!,
  }));
  return rateLimitHeaders(outcome.allowed, inputs, legacyHeaders);
}

/** Names of the policies a denied decision violated, without repeats. */
export function violatedPolicies(outcome: DecisionOutcome): string[] {
  const names = new Set<string>();
  outcome.results.forEach((r, i) => {
    if (outcome.violated[i]) names.add(r.policy);
  });
  return [...names];
}
