import { STATUS_CODES } from 'node:http';
import type { FastifyReply } from 'fastify';
import { PROBLEM_CONTENT_TYPE, problemOf, type Problem, type ShedPath } from '../../core/wire/agent.js';
import { retryAfterWholeSeconds } from '../resilience/admission.js';

export {
  limiterUnavailableProblem,
  PROBLEM_CONTENT_TYPE,
  quotaExceededProblem,
} from '../../core/wire/agent.js';

/**
 * An error's problem document (RFC 9457): `about:blank` with the HTTP status title and the stable code; a shed
 * request's names where it was shed (`shed`).
 */
export function errorProblem(
  status: number,
  code: string,
  detail: string,
  errors?: readonly string[],
  shed?: ShedPath,
): Problem {
  return problemOf(status, STATUS_CODES[status] ?? 'Error', code, detail, errors, shed);
}

/**
 * The `Retry-After` (whole seconds) of an error answer with stable `code`, or undefined when it carries none: a
 * shed (503 `AGT_ERR_OVERLOADED`, at the door or after admission, e.g. by a strict policy's home region) says when
 * to ask again, `overloadRetryAfterMs` (QP_OVERLOAD_RETRY_AFTER_MS) rounded up. The single routes send it as the
 * header (error-handler.ts); the batch route puts it in the element's answer (`retryAfter`, batch-route.ts).
 */
export function errorRetryAfter(code: string, overloadRetryAfterMs: number): number | undefined {
  return code === 'AGT_ERR_OVERLOADED' ? retryAfterWholeSeconds(overloadRetryAfterMs) : undefined;
}

/** Send a problem document. */
export function sendProblem(reply: FastifyReply, problem: Problem): FastifyReply {
  return reply.code(problem.status).type(PROBLEM_CONTENT_TYPE).send(problem);
}
