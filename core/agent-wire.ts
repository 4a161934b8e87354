/**
 * The regional agent's HTTP contract (DESIGN.md "Agent HTTP contract"): what a service sends to
 * `POST /v1/decisions`, what it gets back, and the problem documents of errors. Shared by the agent, the typed
 * client and the Fastify plugin, so both sides of the wire read the same schemas.
 */
import { z } from 'zod';
import { PolicyMode } from './policy.js';

/** Most checks one decision request may carry. */
export const MAX_CHECKS_PER_REQUEST = 16;
/** Longest idempotency key a caller may send. */
export const MAX_IDEMPOTENCY_KEY_LENGTH = 256;
/** Longest policy name or raw subject accepted on the wire (subjects are validated further by the agent). */
export const MAX_WIRE_POLICY_LENGTH = 64;
export const MAX_WIRE_SUBJECT_LENGTH = 1024;

const PolicyField = z.string().min(1).max(MAX_WIRE_POLICY_LENGTH);
const SubjectField = z.string().min(1).max(MAX_WIRE_SUBJECT_LENGTH);
/** Tokens a check costs: > 0 and finite; the agent refuses costs above the policy's `maxCost`. */
const CostField = z.number().positive('cost must be > 0').max(1e9);
const IdempotencyKeyField = z
  .string()
  .min(1)
  .max(MAX_IDEMPOTENCY_KEY_LENGTH)
  .regex(/^[\x21-\x7e]+$/, 'idempotencyKey must be printable ASCII without spaces');

/** One bucket to check: a policy, the subject it applies to, and the cost (default 1). */
export const DecisionCheck = z.strictObject({
  policy: PolicyField,
  subject: SubjectField,
  cost: CostField.optional(),
});
export type DecisionCheck = z.infer<typeof DecisionCheck>;

/** `{ policy, subject, cost? }`: one check. */
export const SingleDecisionRequest = z.strictObject({
  policy: PolicyField,
  subject: SubjectField,
  cost: CostField.optional(),
  /** A retry with the same key returns the first decision and charges nothing. */
  idempotencyKey: IdempotencyKeyField.optional(),
  /** Decide without charging or writing anything. */
  dryRun: z.boolean().optional(),
});
export type SingleDecisionRequest = z.infer<typeof SingleDecisionRequest>;

/** `{ checks: [...] }`: layered checks, decided all-or-nothing. */
export const LayeredDecisionRequest = z.strictObject({
  checks: z.array(DecisionCheck).min(1).max(MAX_CHECKS_PER_REQUEST),
  idempotencyKey: IdempotencyKeyField.optional(),
  dryRun: z.boolean().optional(),
});
export type LayeredDecisionRequest = z.infer<typeof LayeredDecisionRequest>;

/** The body of `POST /v1/decisions`. */
export const DecisionRequest = z.union([SingleDecisionRequest, LayeredDecisionRequest]);
export type DecisionRequest = z.infer<typeof DecisionRequest>;

/**
 * Why a result is not an ordinary decision of the policy's bucket.
 * - `store_unavailable`: the bucket store failed or missed the deadline; the policy fails closed.
 * - `home_unreachable`: a strict policy's home region could not decide; the policy fails closed.
 * - `no_lease`: this region holds no share of the policy; the policy fails closed.
 * - `cost_exceeds_share`: the cost can never fit this region's share of the bucket.
 * - `fail_open`: one of the above happened and the policy fails open (admitted, counted).
 * - `emergency_bucket`: one of the above happened and the policy decided from the in-process emergency bucket.
 * - `agent_unreachable`: set by the client SDK when the agent itself could not answer.
 */
export const DecisionReason = z.enum([
  'store_unavailable',
  'home_unreachable',
  'no_lease',
  'cost_exceeds_share',
  'fail_open',
  'emergency_bucket',
  'agent_unreachable',
]);
export type DecisionReason = z.infer<typeof DecisionReason>;

/** What failed when a result is degraded (`fail_open`, `emergency_bucket`, or a fail-closed reason). */
export const DegradedCause = z.enum(['store_unavailable', 'home_unreachable', 'no_lease', 'emergency_full']);
export type DegradedCause = z.infer<typeof DegradedCause>;

/** One check's decision. */
export const CheckResult = z.object({
  policy: z.string(),
  /** True when the whole request was admitted and this check was charged. */
  allowed: z.boolean(),
  /** Tokens left in this region's bucket (before the request when denied), ≥ 0. */
  remaining: z.number().min(0),
  /** Capacity this region enforces for the policy (its share of the global burst). */
  limit: z.number().min(0),
  /** Milliseconds until the bucket is full; null when it never will be. */
  resetMs: z.number().min(0).nullable(),
  /** Milliseconds until this check's cost could fit; 0 when it fits now; null when it never can. */
  retryAfterMs: z.number().min(0).nullable(),
  mode: PolicyMode,
  reason: DecisionReason.optional(),
  cause: DegradedCause.optional(),
});
export type CheckResult = z.infer<typeof CheckResult>;

/** The answer of `POST /v1/decisions` (always HTTP 200 for a decision). */
export const DecisionResponse = z.object({
  allowed: z.boolean(),
  /** 0 when allowed; the longest wait of the denied checks; null when some denied check can never fit. */
  retryAfterMs: z.number().min(0).nullable(),
  results: z.array(CheckResult),
  /** Headers a service should forward to its own client (`RateLimit-Policy`, `RateLimit`, `Retry-After`, …). */
  headers: z.record(z.string(), z.string()),
  /** True when an idempotency record answered with the first decision; nothing was charged. */
  replayed: z.boolean().optional(),
});
export type DecisionResponse = z.infer<typeof DecisionResponse>;

/** Query of `GET /v1/forward-auth`. */
export const ForwardAuthQuery = z.strictObject({
  policy: PolicyField,
  cost: z.coerce.number().positive('cost must be > 0').max(1e9).optional(),
});
export type ForwardAuthQuery = z.infer<typeof ForwardAuthQuery>;

/** IANA problem type of an over-quota answer (429). */
export const QUOTA_EXCEEDED_TYPE = 'https://iana.org/assignments/http-problem-types#quota-exceeded';
/** IANA problem type of a limiter that cannot decide for a fail-closed policy (503). */
export const TEMPORARY_REDUCED_CAPACITY_TYPE =
  'https://iana.org/assignments/http-problem-types#temporary-reduced-capacity';

/** An RFC 9457 problem document, with the stable `code` every quotaplane error carries. */
export const Problem = z.looseObject({
  type: z.string(),
  title: z.string(),
  status: z.number().int(),
  code: z.string(),
  detail: z.string().optional(),
  instance: z.string().optional(),
  /** Policies whose quota was exceeded (429). */
  'violated-policies': z.array(z.string()).optional(),
  /** Every validation problem found, for 400s. */
  errors: z.array(z.string()).optional(),
});
export type Problem = z.infer<typeof Problem>;

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const text = (v: unknown, max: number): boolean => typeof v === 'string' && v.length >= 1 && v.length <= max;
const cost = (v: unknown): boolean => v === undefined || (typeof v === 'number' && v > 0 && v <= 1e9);
const idemKey = (v: unknown): boolean =>
  v === undefined ||
  (typeof v === 'string' &&
    v.length >= 1 &&
    v.length <= MAX_IDEMPOTENCY_KEY_LENGTH &&
    /^[\x21-\x7e]+$/.test(v));
const flag = (v: unknown): boolean => v === undefined || typeof v === 'boolean';

const SINGLE_KEYS = new Set(['policy', 'subject', 'cost', 'idempotencyKey', 'dryRun']);
const LAYERED_KEYS = new Set(['checks', 'idempotencyKey', 'dryRun']);
const CHECK_KEYS = new Set(['policy', 'subject', 'cost']);

function onlyKeys(o: Record<string, unknown>, allowed: ReadonlySet<string>): boolean {
  for (const k in o) if (!allowed.has(k)) return false;
  return true;
}

function looksValidCheck(c: unknown): c is DecisionCheck {
  return (
    isObject(c) &&
    onlyKeys(c, CHECK_KEYS) &&
    text(c['policy'], MAX_WIRE_POLICY_LENGTH) &&
    text(c['subject'], MAX_WIRE_SUBJECT_LENGTH) &&
    cost(c['cost'])
  );
}

/**
 * The hot path's check: true only for bodies DecisionRequest accepts (a property test holds it to that), so
 * valid requests skip zod; anything else goes to zod for its exact list of problems.
 */
export function looksValidDecisionRequest(input: unknown): input is DecisionRequest {
  if (!isObject(input)) return false;
  if (!idemKey(input['idempotencyKey']) || !flag(input['dryRun'])) return false;
  const checks = input['checks'];
  if (checks === undefined) {
    return (
      onlyKeys(input, SINGLE_KEYS) &&
      text(input['policy'], MAX_WIRE_POLICY_LENGTH) &&
      text(input['subject'], MAX_WIRE_SUBJECT_LENGTH) &&
      cost(input['cost'])
    );
  }
  if (!onlyKeys(input, LAYERED_KEYS) || !Array.isArray(checks)) return false;
  if (checks.length < 1 || checks.length > MAX_CHECKS_PER_REQUEST) return false;
  for (const c of checks) if (!looksValidCheck(c)) return false;
  return true;
}

/** The checks of a request, whichever form it took. */
export function checksOf(request: DecisionRequest): readonly DecisionCheck[] {
  if ('checks' in request) return request.checks;
  return [
    request.cost === undefined
      ? { policy: request.policy, subject: request.subject }
      : { policy: request.policy, subject: request.subject, cost: request.cost },
  ];
}
