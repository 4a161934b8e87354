import { STATUS_CODES } from 'node:http';
import type { FastifyReply } from 'fastify';
import { QUOTA_EXCEEDED_TYPE, TEMPORARY_REDUCED_CAPACITY_TYPE, type Problem } from '../../core/agent-wire.js';
import { LIMITER_UNAVAILABLE, RATE_LIMITED } from '../errors.js';

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/** An error's problem document (RFC 9457): `about:blank` with the HTTP status title and the stable code. */
export function errorProblem(
  status: number,
  code: string,
  detail: string,
  errors?: readonly string[],
): Problem {
  const problem: Problem = {
    type: 'about:blank',
    title: STATUS_CODES[status] ?? 'Error',
    status,
    code,
    detail,
  };
  if (errors !== undefined && errors.length > 0) problem.errors = [...errors];
  return problem;
}

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

/** 503: a fail-closed policy could not be decided (store, home region or lease unavailable). */
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

/** Send a problem document. */
export function sendProblem(reply: FastifyReply, problem: Problem): FastifyReply {
  return reply.code(problem.status).type(PROBLEM_CONTENT_TYPE).send(problem);
}
