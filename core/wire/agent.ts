/**
 * The regional agent's HTTP contract (docs/design.md "Agent HTTP contract"): what a service sends to
 * `POST /v1/decisions`, what it gets back, and the problem documents of errors. Shared by the agent, the typed
 * client and the Fastify plugin, so both sides of the wire read the same schemas.
 */
import { z } from 'zod';
import { replyRecord } from '../own-keys.js';
import { isTokenCost, TokenCost } from './bucket.js';
import { ClassName, PolicyMode } from '../policy/names.js';
import { DecimalText } from './decimal-text.js';

/** Most checks one decision request may carry. */
export const MAX_CHECKS_PER_REQUEST = 16;
/** Longest idempotency key a caller may send. */
export const MAX_IDEMPOTENCY_KEY_LENGTH = 256;
/** Longest policy name or raw subject accepted on the wire (subjects are validated further by the agent). */
export const MAX_WIRE_POLICY_LENGTH = 64;
export const MAX_WIRE_SUBJECT_LENGTH = 1024;
/**
 * Response header of the decision routes: the longest this agent may take to answer a decision, ms (its decision
 * deadline plus the allowance of the farthest link it knows: a strict check forwarded to a far home, a loan). A
 * client whose timeout is shorter gives up on answers the agent is still making, so `@quotaplane/client` keeps
 * its default timeout above it.
 */
export const ANSWER_WITHIN_HEADER = 'quotaplane-answer-within-ms';
/**
 * What a caller should assume of an agent it has not heard from yet, ms: the default decision deadline (250) plus
 * the allowance of a link not yet measured (1.25 × 250 ms, core/distance.ts UNMEASURED_ROUND_TRIP_MS), as the
 * agent itself assumes for a far home before its first answer.
 */
export const FIRST_ANSWER_WITHIN_MS = 563;

const PolicyField = z.string().min(1).max(MAX_WIRE_POLICY_LENGTH);
const SubjectField = z.string().min(1).max(MAX_WIRE_SUBJECT_LENGTH);
/** Tokens a check costs (TokenCost: one micro-token at least); the agent refuses costs above `maxCost`. */
const CostField = TokenCost;
const IdempotencyKeyField = z
  .string()
  .min(1)
  .max(MAX_IDEMPOTENCY_KEY_LENGTH)
  .regex(/^[\x21-\x7e]+$/, 'idempotencyKey must be printable ASCII without spaces');

/**
 * The subject's class (plan, tier) when the caller knows it: one of the policy's `classes`, whose limits then
 * apply; without it the policy's `subjects` map (or its own limits) decides.
 */
const ClassField = ClassName;

/** One bucket to check: a policy, the subject it applies to, and the cost (default 1). */
export const DecisionCheck = z.strictObject({
  policy: PolicyField,
  subject: SubjectField,
  cost: CostField.optional(),
  class: ClassField.optional(),
});
export type DecisionCheck = z.infer<typeof DecisionCheck>;

/** `{ policy, subject, cost? }`: one check. */
export const SingleDecisionRequest = z.strictObject({
  policy: PolicyField,
  subject: SubjectField,
  cost: CostField.optional(),
  class: ClassField.optional(),
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
 * - `subject_exhausted`: the subject used its budget: after borrowing, every other region was asked or is known
 *   dry (what one global bucket would refuse too); without borrowing (and for sliding-log, concurrency and daily
 *   counters, which never borrow), the bucket or counter holds the whole budget (a regional share of 1, strict,
 *   local).
 * - `share_exhausted`: this region's part is used and budget may be left in another region: after borrowing, it
 *   could not be borrowed in time (a lender unreachable or backed off, the deadline, the lender limit); without
 *   borrowing (and for counters), the bucket or counter holds a part of the budget (share < 1) and the agent
 *   cannot see the rest.
 * - `shard_exhausted`: a sharded policy's check landed on a sub-bucket that is empty; others may hold tokens
 *   (the price of spreading a hot key: at most (K-1)/K of the budget idle under an uneven draw).
 * - `subject_flood`: the subject has no bucket yet and the policy's subject-creation cap (`newSubjects`) is
 *   used up for this minute in this region; the policy's flood answer is to deny.
 * - `shared_bucket`: as above, but the flood answer is `shared`: decided on the policy's one shared bucket.
 * - `fail_open`: one of the above happened and the policy fails open (admitted, counted).
 * - `emergency_bucket`: one of the above happened and the policy decided from the in-process emergency bucket.
 * - `agent_unreachable`: set by the client SDK when the agent itself could not answer.
 * - `client_shed`: set by the client SDK when its own queue of decisions waiting to be sent was full: the agent
 *   was not asked (load on the service, not a failure of the agent).
 */
export const DecisionReason = z.enum([
  'store_unavailable',
  'home_unreachable',
  'no_lease',
  'cost_exceeds_share',
  'subject_exhausted',
  'share_exhausted',
  'shard_exhausted',
  'subject_flood',
  'shared_bucket',
  'fail_open',
  'emergency_bucket',
  'agent_unreachable',
  'client_shed',
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
  /**
   * A `concurrency` check that acquired its slots: the lease token that gives them back
   * (`DELETE /v1/leases/{lease}` on the agent of the same region). Unreleased, they come back after the
   * policy's `leaseSeconds`.
   */
  lease: z.string().optional(),
});
export type CheckResult = z.infer<typeof CheckResult>;

/**
 * One check's decision as `POST /v1/decisions` answers it: tokens are whole numbers there, floored as in the
 * `RateLimit` headers (a bucket holding 93.59 tokens admits 93 more requests of cost 1), so no float noise of
 * the share arithmetic reaches a reader. Internally (and between regions) results keep their exact values.
 */
export const WireCheckResult = CheckResult.extend({
  /** Whole tokens left in this region's bucket (before the request when denied), floored, ≥ 0. */
  remaining: z.number().int().min(0),
  /** Capacity this region enforces for the policy (its share of the global burst), floored. */
  limit: z.number().int().min(0),
});
export type WireCheckResult = z.infer<typeof WireCheckResult>;

/** `result` as the HTTP answer carries it: `remaining` and `limit` floored to whole tokens. */
export function wireCheckResult(result: CheckResult): WireCheckResult {
  return {
    ...result,
    remaining: result.remaining > 0 ? Math.floor(result.remaining) : 0,
    limit: result.limit > 0 ? Math.floor(result.limit) : 0,
  };
}

/** The answer of `POST /v1/decisions` (always HTTP 200 for a decision). */
export const DecisionResponse = z.object({
  allowed: z.boolean(),
  /** 0 when allowed; the longest wait of the denied checks; null when some denied check can never fit. */
  retryAfterMs: z.number().min(0).nullable(),
  results: z.array(WireCheckResult),
  /** Headers a service should forward to its own client (`RateLimit-Policy`, `RateLimit`, `Retry-After`, …). */
  headers: replyRecord(z.string(), z.string()),
  /** True when an idempotency record answered with the first decision; nothing was charged. */
  replayed: z.boolean().optional(),
});
export type DecisionResponse = z.infer<typeof DecisionResponse>;

/**
 * Which proxy asks forward-auth, for the statuses it understands:
 * - `generic` (the default) and `traefik`: 204 allowed; 429, 503 or 400 with the problem document, passed on.
 * - `nginx`: `auth_request` passes only 2xx, 401 and 403 (anything else becomes a 500), so every refusal is a
 *   403 whose `X-Quota-Status` header carries the real status for `error_page` to answer with.
 * - `envoy`: ext_authz HTTP allows on 200 only; 429 and 400 are passed on as denials; a 5xx is Envoy's
 *   `status_on_error`.
 */
export const ForwardAuthProxy = z.enum(['generic', 'nginx', 'traefik', 'envoy']);
export type ForwardAuthProxy = z.infer<typeof ForwardAuthProxy>;

/** Query of `GET /v1/forward-auth`. */
export const ForwardAuthQuery = z.strictObject({
  policy: PolicyField,
  cost: DecimalText.pipe(TokenCost).optional(),
  /** The asking proxy's status conventions (also chosen by path: `/v1/forward-auth/nginx`). */
  proxy: ForwardAuthProxy.optional(),
});
export type ForwardAuthQuery = z.infer<typeof ForwardAuthQuery>;

/** IANA problem type of an over-quota answer (429). */
export const QUOTA_EXCEEDED_TYPE = 'https://iana.org/assignments/http-problem-types#quota-exceeded';
/** IANA problem type of a limiter that cannot decide for a fail-closed policy (503). */
export const TEMPORARY_REDUCED_CAPACITY_TYPE =
  'https://iana.org/assignments/http-problem-types#temporary-reduced-capacity';

/**
 * Where a 503 `AGT_ERR_OVERLOADED` was shed (the problem's `shed` member; nothing was decided or charged):
 * - `admission`: this agent's admission control, at the door (in-flight bound, event-loop delay);
 * - `local_deadline`: the decision deadline passed on this agent before a strict check could be forwarded;
 * - `forward_timeout`: no reply within the budget from a home region that answered others lately (busy);
 * - `home_late`: the home took the forwarded request up after the deadline it carried;
 * - `home_admission`: the home's admission control refused the forwarded request;
 * - `home_store_deadline`: the home's store call could not run before the forwarded request's deadline;
 * - `home_other`: the home answered `overloaded` in words this agent does not know (another version);
 * - `store_deadline`: this agent's own store call could not run before a forwarding caller's deadline (a home
 *   answering a forwarded request; its requester hears `home_store_deadline`).
 */
export const SHED_PATHS = [
  'admission',
  'local_deadline',
  'forward_timeout',
  'home_late',
  'home_admission',
  'home_store_deadline',
  'home_other',
  'store_deadline',
] as const;
export type ShedPath = (typeof SHED_PATHS)[number];

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
  /** Where a 503 `AGT_ERR_OVERLOADED` was shed (SHED_PATHS). */
  shed: z.string().optional(),
});
export type Problem = z.infer<typeof Problem>;

/** Media type of every problem document. */
export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/** An error's problem document: `about:blank` with the status's title and the stable code. */
export function problemOf(
  status: number,
  title: string,
  code: string,
  detail: string,
  errors?: readonly string[],
  shed?: ShedPath,
): Problem {
  const problem: Problem = { type: 'about:blank', title, status, code, detail };
  if (errors !== undefined && errors.length > 0) problem.errors = [...errors];
  if (shed !== undefined) problem.shed = shed;
  return problem;
}

/** Stable code of a 429 answer (forward-auth, the plugin): the request is over quota. */
export const RATE_LIMITED = 'RATE_LIMITED';
/** Stable code of a 503 answer: a fail-closed policy could not be decided (store, home region, lease, agent). */
export const LIMITER_UNAVAILABLE = 'LIMITER_UNAVAILABLE';

/** 429: the request is over quota for `violated` policies. */
export function quotaExceededProblem(violated: readonly string[]): Problem {
  return {
    type: QUOTA_EXCEEDED_TYPE,
    title: 'Request cannot be satisfied as assigned quota has been exceeded',
    status: 429,
    code: RATE_LIMITED,
    detail: `quota exceeded for ${violated.join(', ')}`,
    'violated-policies': [...violated],
  };
}

/** 503: a fail-closed policy could not be decided (store, home region, lease or agent unavailable). */
export function limiterUnavailableProblem(policies: readonly string[]): Problem {
  return {
    type: TEMPORARY_REDUCED_CAPACITY_TYPE,
    title: 'Temporary Reduced Capacity',
    status: 503,
    code: LIMITER_UNAVAILABLE,
    detail: `the rate limiter cannot decide ${policies.join(', ')} right now and the policy fails closed`,
    'violated-policies': [...policies],
  };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const text = (v: unknown, max: number): boolean => typeof v === 'string' && v.length >= 1 && v.length <= max;
const cost = (v: unknown): boolean => v === undefined || isTokenCost(v);
/** A value the wire takes as an idempotency key: 1 to 256 printable ASCII characters, no spaces. */
export const isIdempotencyKey = (v: unknown): v is string =>
  typeof v === 'string' &&
  v.length >= 1 &&
  v.length <= MAX_IDEMPOTENCY_KEY_LENGTH &&
  /^[\x21-\x7e]+$/.test(v);
const idemKey = (v: unknown): boolean => v === undefined || isIdempotencyKey(v);
const flag = (v: unknown): boolean => v === undefined || typeof v === 'boolean';
const CLASS_PATTERN = /^[a-z][a-z0-9_-]{0,31}$/;
/** A value the wire takes as a class name (ClassName): the form every policy's class names have. */
export const isClassName = (v: unknown): v is string => typeof v === 'string' && CLASS_PATTERN.test(v);
const className = (v: unknown): boolean => v === undefined || isClassName(v);

const SINGLE_KEYS = new Set(['policy', 'subject', 'cost', 'class', 'idempotencyKey', 'dryRun']);
const LAYERED_KEYS = new Set(['checks', 'idempotencyKey', 'dryRun']);
const CHECK_KEYS = new Set(['policy', 'subject', 'cost', 'class']);

function onlyKeys(o: Record<string, unknown>, allowed: ReadonlySet<string>): boolean {
  for (const k in o) if (!allowed.has(k)) return false;
  return true;
}

/** Whether a single decision body carries only the keys the wire knows (any other is a 400 at the agent). */
export function onlySingleDecisionKeys(body: object): boolean {
  return onlyKeys(body as Record<string, unknown>, SINGLE_KEYS);
}

function looksValidCheck(c: unknown): c is DecisionCheck {
  return (
    isObject(c) &&
    onlyKeys(c, CHECK_KEYS) &&
    text(c['policy'], MAX_WIRE_POLICY_LENGTH) &&
    text(c['subject'], MAX_WIRE_SUBJECT_LENGTH) &&
    cost(c['cost']) &&
    className(c['class'])
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
      cost(input['cost']) &&
      className(input['class'])
    );
  }
  if (!onlyKeys(input, LAYERED_KEYS) || !Array.isArray(checks)) return false;
  if (checks.length < 1 || checks.length > MAX_CHECKS_PER_REQUEST) return false;
  for (const c of checks) if (!looksValidCheck(c)) return false;
  return true;
}

/** The codes a decision body's own problems are refused with (400), most specific first. */
export type DecisionBodyCode =
  'AGT_ERR_TOO_MANY_CHECKS' | 'AGT_ERR_INVALID_COST' | 'AGT_ERR_INVALID_SUBJECT' | 'AGT_ERR_INVALID_REQUEST';

/**
 * A decision body as the agent reads it before looking at any policy: the request, or why it is refused (its code
 * and one line per problem). More checks than a request carries first; then a cost's problem; then a subject of
 * text the wire bounds refuse (empty, longer than MAX_WIRE_SUBJECT_LENGTH), refused as any other subject the
 * agent cannot key; anything else (a subject that is not text, an unknown field) is the body's. Pure: the agent's
 * parser answers with it, and the client refuses with it a body the agent would refuse when it answers for the
 * agent (a failure mode).
 */
export function readDecisionBody(
  body: unknown,
):
  | { ok: true; request: DecisionRequest }
  | { ok: false; code: DecisionBodyCode; problems: string[]; checks?: number } {
  if (looksValidDecisionRequest(body)) return { ok: true, request: body };
  const layered = isObject(body) && 'checks' in body;
  if (layered && Array.isArray(body['checks']) && body['checks'].length > MAX_CHECKS_PER_REQUEST) {
    const checks = body['checks'].length;
    return {
      ok: false,
      code: 'AGT_ERR_TOO_MANY_CHECKS',
      problems: [`checks: at most ${MAX_CHECKS_PER_REQUEST}, got ${checks}`],
      checks,
    };
  }
  const parsed = (layered ? LayeredDecisionRequest : SingleDecisionRequest).safeParse(body);
  if (parsed.success) return { ok: true, request: parsed.data };
  const { issues } = parsed.error;
  const field = (i: (typeof issues)[number]) => i.path[i.path.length - 1];
  return {
    ok: false,
    code: issues.some((i) => field(i) === 'cost')
      ? 'AGT_ERR_INVALID_COST'
      : issues.some((i) => field(i) === 'subject' && (i.code === 'too_big' || i.code === 'too_small'))
        ? 'AGT_ERR_INVALID_SUBJECT'
        : 'AGT_ERR_INVALID_REQUEST',
    problems: issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`),
  };
}

/** The checks of a request, whichever form it took. */
export function checksOf(request: DecisionRequest): readonly DecisionCheck[] {
  if ('checks' in request) return request.checks;
  const check: DecisionCheck = { policy: request.policy, subject: request.subject };
  if (request.cost !== undefined) check.cost = request.cost;
  if (request.class !== undefined) check.class = request.class;
  return [check];
}

/** Path of `DELETE /v1/leases/{lease}`: the token a concurrency check's result carried. */
export const LeaseParams = z.strictObject({ lease: z.string().min(1).max(512) });

/** The answer of `DELETE /v1/leases/{lease}` (200 whether or not the slots were still held: release is idempotent). */
export const LeaseReleaseResponse = z.object({
  policy: z.string(),
  /** True when this call gave the slots back; false when they were already released or their lease ran out. */
  released: z.boolean(),
  /** Slots this call gave back (0 when already released or expired). */
  slots: z.number().int().min(0),
});
export type LeaseReleaseResponse = z.infer<typeof LeaseReleaseResponse>;

/** Query of `GET /v1/explain`: which bucket to look at, and the cost to try (default 1). */
export const ExplainQuery = z.strictObject({
  policy: PolicyField,
  subject: SubjectField,
  cost: DecimalText.pipe(z.number().positive('cost must be > 0').max(1e9)).optional(),
});
export type ExplainQuery = z.infer<typeof ExplainQuery>;

/**
 * `GET /v1/explain`: one region's view of one subject's bucket, read by a dry run (nothing charged or written).
 * `reason` is the reason a refusal would carry now, from the same decision path (`DecisionReason`), absent for
 * an ordinary empty bucket.
 */
export const ExplainResponse = z.object({
  region: z.string(),
  policy: z.string(),
  mode: PolicyMode,
  /** Share of the global budget this region enforces for the subject now (4 decimals, rounded down); null: none. */
  share: z.number().min(0).max(1).nullable(),
  epoch: z.number().int().nonnegative().nullable(),
  /** Capacity this region enforces for the subject (whole tokens, as in decision JSON). */
  limit: z.number().min(0),
  /** Tokens in the bucket now, in whole tokens (exact for whole costs). */
  remaining: z.number().min(0),
  cost: z.number().positive(),
  /** Whether a request of `cost` would be admitted now. */
  wouldAllow: z.boolean(),
  retryAfterMs: z.number().min(0).nullable(),
  reason: DecisionReason.optional(),
  /**
   * The subject's most recent refusal by this region for the policy (charging decisions only: dry runs and
   * explanations are not remembered), or null when none is remembered (never refused here, forgotten by the
   * bounded memory `QP_EXPLAIN_REFUSALS`, or the agent restarted). Absent from agents before 2026-12-04.
   */
  lastRefusal: z
    .object({
      /** When it was refused, ISO 8601 from the agent's clock. */
      at: z.string(),
      /** The reason the refusal carried; null for a refusal without one (an agent's own empty bucket). */
      reason: DecisionReason.nullable(),
      cost: z.number().positive(),
      /** Whole tokens, floored as in decision JSON. */
      limit: z.number().int().min(0),
      remaining: z.number().int().min(0),
      retryAfterMs: z.number().min(0).nullable(),
    })
    .nullable()
    .optional()
    .describe(
      "The subject's most recent refusal by this agent for the policy (charging decisions only), or null when none is remembered",
    ),
});
export type ExplainResponse = z.infer<typeof ExplainResponse>;
export type LastRefusal = NonNullable<ExplainResponse['lastRefusal']>;
