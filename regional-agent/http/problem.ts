import { STATUS_CODES } from 'node:http';
import type { FastifyReply } from 'fastify';
import { PROBLEM_CONTENT_TYPE, problemOf, type Problem, type ShedPath } from '../../core/wire/agent.js';

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

/** Send a problem document. */
export function sendProblem(reply: FastifyReply, problem: Problem): FastifyReply {
  return reply.code(problem.status).type(PROBLEM_CONTENT_TYPE).send(problem);
}
