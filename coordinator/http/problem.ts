/**
 * Every failure as an RFC 9457 problem document with a stable code. A 4xx carries its message and field
 * problems; a 5xx is logged with its cause and answered with a fixed text, so no internal detail leaks.
 */
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { hasZodFastifySchemaValidationErrors } from 'fastify-type-provider-zod';
import type { FieldProblem, Problem } from '../../core/wire/admin.js';
import { Errors, isCoordinatorError, type WithFieldProblems } from '../errors.js';
import type { CoordinatorMetrics } from '../metrics.js';

/** Problem `type` of a code: a URN, stable and never resolved. */
export function problemType(code: string): string {
  return `urn:quotaplane:problem:${code.toLowerCase().replaceAll('_', '-')}`;
}

const TITLES: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'Not Found',
  409: 'Conflict',
  412: 'Precondition Failed',
  413: 'Content Too Large',
  415: 'Unsupported Media Type',
  422: 'Unprocessable Content',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
};

interface Classified {
  status: number;
  code: string;
  detail: string;
  errors?: readonly FieldProblem[] | undefined;
}

/** Map any thrown value to the problem it answers with. */
export function classify(error: unknown, bodyLimitBytes: number): Classified {
  if (hasZodFastifySchemaValidationErrors(error)) {
    const context = (error as { validationContext?: string }).validationContext ?? 'request';
    const errors = error.validation.map((v) => ({
      path: [context, ...v.instancePath.split('/').filter((s) => s !== '')].join('.'),
      message: v.message ?? 'invalid',
    }));
    return {
      status: 400,
      code: 'COORD_ERR_VALIDATION',
      detail: `The request is invalid: ${errors.map((e) => `${e.path}: ${e.message}`).join('; ')}`,
      errors,
    };
  }
  if (isCoordinatorError(error)) {
    const errors = (error as WithFieldProblems).errors;
    if (error.statusCode >= 500) {
      const masked = error.code === 'COORD_ERR_INTERNAL' ? new Errors.INTERNAL() : error;
      return { status: error.statusCode, code: error.code, detail: masked.message };
    }
    return { status: error.statusCode, code: error.code, detail: error.message, errors };
  }
  const code = (error as Partial<FastifyError>).code;
  switch (code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return fromError(new Errors.BODY_TOO_LARGE(bodyLimitBytes));
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return fromError(new Errors.UNSUPPORTED_MEDIA_TYPE());
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return fromError(new Errors.MALFORMED_BODY());
    default:
      break;
  }
  const status = (error as Partial<FastifyError>).statusCode;
  if (error instanceof SyntaxError && status === 400) return fromError(new Errors.MALFORMED_BODY());
  return fromError(new Errors.INTERNAL());
}

function fromError(e: Error & { code: string; statusCode?: number }): Classified {
  return { status: e.statusCode ?? 500, code: e.code, detail: e.message };
}

/** Send a problem document. */
export function sendProblem(reply: FastifyReply, request: FastifyRequest, c: Classified): FastifyReply {
  const problem: Problem = {
    type: problemType(c.code),
    title: TITLES[c.status] ?? 'Error',
    status: c.status,
    detail: c.detail,
    code: c.code,
    instance: request.url.split('?')[0] ?? request.url,
    requestId: request.id,
    ...(c.errors !== undefined && c.errors.length > 0 ? { errors: [...c.errors] } : {}),
  };
  return reply
    .code(c.status)
    .header('content-type', 'application/problem+json; charset=utf-8')
    .send(JSON.stringify(problem));
}

/** The app's error handler: classify, count, log 5xx with their cause, answer. */
export function problemHandler(metrics: CoordinatorMetrics, bodyLimitBytes: number) {
  return (error: unknown, request: FastifyRequest, reply: FastifyReply): FastifyReply => {
    const c = classify(error, bodyLimitBytes);
    metrics.problems.inc({ code: c.code });
    if (c.status >= 500) request.log.error({ err: error, code: c.code }, 'request failed');
    if (c.status === 503) reply.header('retry-after', '1');
    return sendProblem(reply, request, c);
  };
}
