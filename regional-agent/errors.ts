/**
 * Every error the agent answers with, in the style of fastify's `lib/errors.js`: a stable code, a message
 * template and an HTTP status. docs/errors.md lists each code exactly once (a test holds it to that).
 * Decision outcomes that are not errors of the caller (429 over quota, 503 limiter unavailable) have their own
 * stable codes at the end.
 */
import createError from '@fastify/error';
import { LIMITER_UNAVAILABLE, RATE_LIMITED, type ShedPath } from '../core/wire/agent.js';

export const AgentErrors = {
  AGT_ERR_INVALID_REQUEST: createError('AGT_ERR_INVALID_REQUEST', 'Invalid decision request: %s', 400),
  AGT_ERR_MALFORMED_JSON: createError('AGT_ERR_MALFORMED_JSON', 'The body is not valid JSON', 400),
  AGT_ERR_BODY_TOO_LARGE: createError('AGT_ERR_BODY_TOO_LARGE', 'The body is larger than %s bytes', 413),
  AGT_ERR_UNSUPPORTED_MEDIA_TYPE: createError(
    'AGT_ERR_UNSUPPORTED_MEDIA_TYPE',
    'Send the body as application/json',
    415,
  ),
  AGT_ERR_TOO_MANY_CHECKS: createError(
    'AGT_ERR_TOO_MANY_CHECKS',
    'A request may carry at most %s checks, got %s',
    400,
  ),
  AGT_ERR_UNKNOWN_POLICY: createError('AGT_ERR_UNKNOWN_POLICY', 'Unknown policy %s', 404),
  AGT_ERR_INVALID_SUBJECT: createError('AGT_ERR_INVALID_SUBJECT', 'Invalid subject: %s', 400),
  AGT_ERR_INVALID_COST: createError('AGT_ERR_INVALID_COST', 'Invalid cost: %s', 400),
  AGT_ERR_COST_ABOVE_MAX: createError(
    'AGT_ERR_COST_ABOVE_MAX',
    'Cost %s is above the largest cost policy %s allows (%s)',
    400,
  ),
  AGT_ERR_DUPLICATE_CHECK: createError(
    'AGT_ERR_DUPLICATE_CHECK',
    'Policy %s is checked twice for the same subject in one request',
    400,
  ),
  AGT_ERR_IDEMPOTENCY_CONFLICT: createError(
    'AGT_ERR_IDEMPOTENCY_CONFLICT',
    'This idempotency key already answers a different request, or one still being decided',
    409,
  ),
  AGT_ERR_MIXED_HOME_REGIONS: createError(
    'AGT_ERR_MIXED_HOME_REGIONS',
    'Checks of strict policies homed in different regions (%s) cannot share one request',
    400,
  ),
  AGT_ERR_MISSING_SUBJECT: createError('AGT_ERR_MISSING_SUBJECT', 'No subject: %s', 400),
  AGT_ERR_INVALID_QUERY: createError('AGT_ERR_INVALID_QUERY', 'Invalid query: %s', 400),
  AGT_ERR_NOT_FOUND: createError('AGT_ERR_NOT_FOUND', 'No route %s %s', 404),
  AGT_ERR_URI_TOO_LONG: createError(
    'AGT_ERR_URI_TOO_LONG',
    'A path parameter is longer than %s characters',
    414,
  ),
  AGT_ERR_NOT_READY: createError('AGT_ERR_NOT_READY', 'The agent is not ready: %s', 503),
  AGT_ERR_OVERLOADED: createError(
    'AGT_ERR_OVERLOADED',
    'The agent is overloaded (%s): nothing was decided or charged; retry after Retry-After',
    503,
  ),
  AGT_ERR_INTERNAL: createError('AGT_ERR_INTERNAL', 'Internal error', 500),
  AGT_ERR_UNTRUSTED_PROXY: createError('AGT_ERR_UNTRUSTED_PROXY', 'Forward-auth refused: %s', 400),
  AGT_ERR_INVALID_LEASE: createError('AGT_ERR_INVALID_LEASE', 'Invalid lease: %s', 400),
  AGT_ERR_WRONG_REGION: createError(
    'AGT_ERR_WRONG_REGION',
    "This %s lives in region %s: use that region's agent",
    421,
  ),
  AGT_ERR_STORE_UNAVAILABLE: createError(
    'AGT_ERR_STORE_UNAVAILABLE',
    'The store could not answer (%s): nothing was changed; retry',
    503,
  ),
  AGT_ERR_INVALID_RESERVATION: createError('AGT_ERR_INVALID_RESERVATION', 'Invalid reservation: %s', 400),
  AGT_ERR_UNKNOWN_RESERVATION: createError(
    'AGT_ERR_UNKNOWN_RESERVATION',
    'No reservation %s (never made, or settled more than a day ago)',
    404,
  ),
  AGT_ERR_COMMIT_ABOVE_RESERVED: createError(
    'AGT_ERR_COMMIT_ABOVE_RESERVED',
    'Cannot commit %s: only %s was reserved',
    400,
  ),
  AGT_ERR_RESERVATION_EXPIRED: createError(
    'AGT_ERR_RESERVATION_EXPIRED',
    'Reservation %s expired before it was settled: it was refunded whole',
    409,
  ),
  AGT_ERR_RESERVATION_SETTLED: createError(
    'AGT_ERR_RESERVATION_SETTLED',
    'Reservation %s is already %s',
    409,
  ),
  AGT_ERR_UNKNOWN_CLASS: createError(
    'AGT_ERR_UNKNOWN_CLASS',
    'Class %s is not one of the classes of policy %s',
    400,
  ),
  AGT_ERR_BATCH_TOO_LARGE: createError(
    'AGT_ERR_BATCH_TOO_LARGE',
    'A batch may carry at most %s decisions, got %s',
    400,
  ),
  AGT_ERR_INVALID_GRANT: createError('AGT_ERR_INVALID_GRANT', 'Invalid grant request: %s', 400),
  AGT_ERR_GRANT_NOT_ALLOWED: createError(
    'AGT_ERR_GRANT_NOT_ALLOWED',
    'Policy %s gives no local grants: %s',
    400,
  ),
  AGT_ERR_UNKNOWN_GRANT: createError(
    'AGT_ERR_UNKNOWN_GRANT',
    'No grant %s of this policy and subject to hand back (never taken, expired, or already returned)',
    404,
  ),
  AGT_ERR_INVALID_TERM: createError('AGT_ERR_INVALID_TERM', 'Invalid term request: %s', 400),
  AGT_ERR_TERM_NOT_ALLOWED: createError('AGT_ERR_TERM_NOT_ALLOWED', 'Policy %s gives no terms: %s', 400),
  AGT_ERR_TERM_UNAVAILABLE: createError(
    'AGT_ERR_TERM_UNAVAILABLE',
    'No term of policy %s now (%s): decide each request at the agent',
    503,
  ),
  AGT_ERR_TERMS_OFF: createError(
    'AGT_ERR_TERMS_OFF',
    'This agent gives no terms (QP_TERMS=off): decide each request at the agent',
    404,
  ),
} as const;

export type AgentErrorCode = keyof typeof AgentErrors;

// The stable codes of a 429 and a 503 outcome live with the wire contract, which the client shares.
export { LIMITER_UNAVAILABLE, RATE_LIMITED };

/** Every code the agent can answer with, errors and outcomes alike. */
export const AGENT_CODES: readonly string[] = [
  ...Object.keys(AgentErrors),
  RATE_LIMITED,
  LIMITER_UNAVAILABLE,
];

/** An agent error carrying a list of every problem found (validation). */
export interface AgentError extends Error {
  code: string;
  statusCode?: number;
  /** Every problem found, when there were several. */
  errors?: readonly string[];
  /** Where a 503 AGT_ERR_OVERLOADED was shed (the problem's `shed` member). */
  shed?: ShedPath;
}

/** Build an agent error with its list of problems. */
export function withProblems<E extends Error>(error: E, problems: readonly string[]): E & AgentError {
  return Object.assign(error, { errors: problems }) as E & AgentError;
}

/**
 * A 503 AGT_ERR_OVERLOADED shed on `path` (core/wire/agent.ts SHED_PATHS), `why` in words: the path leads the
 * message and is the problem's `shed` member, so every shed says where it happened.
 */
export function shedError(path: ShedPath, why: string): AgentError {
  return Object.assign(new AgentErrors.AGT_ERR_OVERLOADED(`${path}: ${why}`), { shed: path });
}

/** The shed path an error carries, when it is a 503 AGT_ERR_OVERLOADED that names one. */
export function shedPathOf(error: unknown): ShedPath | undefined {
  return error instanceof AgentErrors.AGT_ERR_OVERLOADED ? (error as AgentError).shed : undefined;
}
