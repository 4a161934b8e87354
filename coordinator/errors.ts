/**
 * Every error the coordinator's admin API answers with, one stable code each (docs/errors.md, "Coordinator").
 * Built with @fastify/error, as fastify's own `lib/errors.js`: `new Errors.POLICY_NOT_FOUND('writes')`.
 * A 4xx reaches the client as problem+json with its message; a 5xx is logged and masked.
 */
import createError from '@fastify/error';

export const Errors = {
  UNAUTHORIZED: createError('COORD_ERR_UNAUTHORIZED', 'A valid bearer token is required', 401),
  FORBIDDEN: createError('COORD_ERR_FORBIDDEN', 'The %s role may not %s', 403),
  VALIDATION: createError('COORD_ERR_VALIDATION', 'The request is invalid: %s', 400),
  MALFORMED_BODY: createError('COORD_ERR_MALFORMED_BODY', 'The request body is not valid JSON', 400),
  UNSUPPORTED_MEDIA_TYPE: createError(
    'COORD_ERR_UNSUPPORTED_MEDIA_TYPE',
    'Send the body as application/json',
    415,
  ),
  BODY_TOO_LARGE: createError('COORD_ERR_BODY_TOO_LARGE', 'The request body exceeds %s bytes', 413),
  ROUTE_NOT_FOUND: createError('COORD_ERR_ROUTE_NOT_FOUND', 'No route %s %s', 404),
  POLICY_NOT_FOUND: createError('COORD_ERR_POLICY_NOT_FOUND', 'No policy named %s', 404),
  BAD_PRECONDITION: createError('COORD_ERR_BAD_PRECONDITION', 'Malformed %s header: %s', 400),
  PRECONDITION_FAILED: createError('COORD_ERR_PRECONDITION_FAILED', '%s', 412),
  CONFLICT: createError(
    'COORD_ERR_CONFLICT',
    'Policy %s kept changing while this request tried to write it; retry',
    409,
  ),
  POLICY_LIMIT: createError(
    'COORD_ERR_POLICY_LIMIT',
    'The store already holds %s policies, the configured maximum; delete one or raise QP_MAX_POLICIES',
    409,
  ),
  RESTORE_NOT_EMPTY: createError(
    'COORD_ERR_RESTORE_NOT_EMPTY',
    'This coordinator already holds policies; a restore goes into an empty one (delete them first)',
    409,
  ),
  INVALID_POLICY: createError('COORD_ERR_INVALID_POLICY', 'The resulting policy would be invalid: %s', 422),
  STORE_UNAVAILABLE: createError(
    'COORD_ERR_STORE_UNAVAILABLE',
    'The policy store (NATS JetStream) is unavailable; retry shortly',
    503,
  ),
  NOT_READY: createError('COORD_ERR_NOT_READY', 'The coordinator is shutting down', 503),
  NOT_LEADER: createError(
    'COORD_ERR_NOT_LEADER',
    'This coordinator does not hold the leader lease; send writes to the leader',
    503,
  ),
  INTERNAL: createError('COORD_ERR_INTERNAL', 'Internal error', 500),
} as const;

/** Every code above: the test that keeps docs/errors.md complete reads this list. */
export const ERROR_CODES: readonly string[] = Object.values(Errors).map((E) => new E().code);

/** An error carrying the per-field problems of a request (`Problem.errors`). */
export interface WithFieldProblems {
  readonly errors?: readonly { path: string; message: string }[];
}

/** Attach per-field problems to an error, for the problem document's `errors`. */
export function withFieldProblems<E extends Error>(
  error: E,
  errors: readonly { path: string; message: string }[],
): E & WithFieldProblems {
  return Object.assign(error, { errors });
}

/** Whether an error is one of `Errors` (a code starting with COORD_ERR_). */
export function isCoordinatorError(error: unknown): error is Error & { code: string; statusCode: number } {
  if (!(error instanceof Error)) return false;
  const { code, statusCode } = error as Error & { code?: unknown; statusCode?: unknown };
  return typeof code === 'string' && code.startsWith('COORD_ERR_') && typeof statusCode === 'number';
}
