/**
 * A decision as Envoy's rate-limit service answers it: one status per descriptor (OK or OVER_LIMIT, the
 * region's limit as requests per unit, whole tokens remaining, time until reset), the draft RateLimit headers
 * (and `Retry-After`) for Envoy to add to the client's response, and on a refusal the problem document as the
 * body Envoy sends.
 */
import type { CheckResult } from '../../core/wire/agent.js';
import type { Policy } from '../../core/policy/policy.js';
import {
  protoDuration,
  type RlsDescriptorStatus,
  type RlsResponse,
  type RlsUnit,
} from '../../core/wire/rls.js';
import type { DecisionOutcome } from '../decisions/decision-service.js';
import { decisionHeaders, violatedPolicies } from '../http/decision-reply.js';
import { LIMITER_UNAVAILABLE } from '../errors.js';
import { PROBLEM_CONTENT_TYPE, quotaExceededProblem } from '../http/problem.js';
import type { RateLimitDraft } from '../../core/wire/rate-limit-headers.js';

const UNITS: readonly (readonly [RlsUnit, number])[] = [
  ['SECOND', 1],
  ['MINUTE', 60],
  ['HOUR', 3600],
  ['DAY', 86_400],
];
const UINT32_MAX = 0xffff_ffff;

/**
 * A sustained rate (tokens per second) as requests per unit: the smallest unit in which it is a whole number,
 * else the smallest in which it is at least 100 (so flooring it loses under 1 %), else per day, floored.
 * 1.5/s is 90 per minute; 0.1/s is 6 per minute; 2/s is 2 per second.
 */
export function perUnit(rate: number): { requests_per_unit: number; unit: RlsUnit } {
  for (const [unit, seconds] of UNITS) {
    const n = rate * seconds;
    if (n >= 1 && Math.abs(n - Math.round(n)) <= 1e-9 * n) return { requests_per_unit: Math.round(n), unit };
  }
  for (const [unit, seconds] of UNITS) {
    const n = rate * seconds;
    if (n >= 100) return { requests_per_unit: Math.min(UINT32_MAX, Math.floor(n)), unit };
  }
  return { requests_per_unit: Math.floor(rate * 86_400), unit: 'DAY' };
}

function status(result: CheckResult, policy: Policy | undefined, allowed: boolean, violated: boolean) {
  const out: RlsDescriptorStatus = {
    code: violated ? 'OVER_LIMIT' : 'OK',
    limit_remaining: Math.min(UINT32_MAX, Math.max(0, Math.floor(result.remaining))),
  };
  if (policy !== undefined && policy.capacity > 0) {
    // The region enforces a share of the policy: the limit scales the refill by the same factor.
    const rate = (policy.refillPerSecond * result.limit) / policy.capacity;
    out.current_limit = { name: result.policy, ...perUnit(rate) };
  }
  const wait = allowed ? result.resetMs : result.retryAfterMs;
  if (wait !== null) out.duration_until_reset = protoDuration(wait);
  return out;
}

const enc = new TextEncoder();

/**
 * The response to a request whose descriptor `i` is check `toCheck[i]` of `outcome` (undefined: no rule
 * matched it, so it is not limited). `outcome` is undefined when no descriptor matched.
 */
export function rlsResponse(
  toCheck: readonly (number | undefined)[],
  outcome: DecisionOutcome | undefined,
  policies: ReadonlyMap<string, Policy>,
  legacyHeaders: boolean,
  draft?: RateLimitDraft,
): RlsResponse {
  const statuses = toCheck.map((c): RlsDescriptorStatus => {
    if (c === undefined || outcome === undefined) return { code: 'OK', limit_remaining: 0 };
    const result = outcome.results[c]!;
    return status(result, policies.get(result.policy), outcome.allowed, !outcome.checks[c]!.fits);
  });
  if (outcome === undefined) return { overall_code: 'OK', statuses, response_headers_to_add: [] };
  const headers = Object.entries(decisionHeaders(outcome, legacyHeaders, draft)).map(([key, value]) => ({
    key: key.toLowerCase(),
    value,
  }));
  if (outcome.allowed) return { overall_code: 'OK', statuses, response_headers_to_add: headers };
  // Envoy answers OVER_LIMIT with 429 (its rate_limited_status): the problem says the same, and says when a
  // policy that fails closed, not the quota, refused.
  const violated = violatedPolicies(outcome);
  const problem = quotaExceededProblem(violated);
  if (outcome.unavailable) {
    problem.code = LIMITER_UNAVAILABLE;
    problem.detail = `the rate limiter cannot decide ${violated.join(', ')} right now and the policy fails closed`;
  }
  headers.push({ key: 'content-type', value: PROBLEM_CONTENT_TYPE });
  return {
    overall_code: 'OVER_LIMIT',
    statuses,
    response_headers_to_add: headers,
    raw_body: enc.encode(JSON.stringify(problem)),
  };
}
