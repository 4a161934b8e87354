import type { FastifyError, FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { hasOwnKey, ownValue } from '../../core/own-keys.js';
import { AgentErrors, type AgentError } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import { errorProblem, errorRetryAfter, sendProblem } from './problem.js';

/** Fastify's own errors for bodies, mapped to the agent's stable codes. */
const FRAMEWORK_CODES: Record<string, () => AgentError> = {
  FST_ERR_CTP_INVALID_JSON_BODY: () => new AgentErrors.AGT_ERR_MALFORMED_JSON(),
  FST_ERR_CTP_EMPTY_JSON_BODY: () => new AgentErrors.AGT_ERR_MALFORMED_JSON(),
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: () => new AgentErrors.AGT_ERR_MALFORMED_JSON(),
  FST_ERR_CTP_INVALID_MEDIA_TYPE: () => new AgentErrors.AGT_ERR_UNSUPPORTED_MEDIA_TYPE(),
};

/**
 * Every error leaves as an RFC 9457 problem document with a stable code, counted by code. 4xx say what was
 * wrong; 5xx are logged and masked (no internal detail, key or id reaches the caller).
 */
export function installErrorHandling(
  app: FastifyInstance,
  options: { metrics: AgentMetrics; log: Logger; bodyLimit: number; overloadRetryAfterMs: number },
): void {
  const { metrics, log, bodyLimit, overloadRetryAfterMs } = options;
  app.setErrorHandler((raw: FastifyError & AgentError, request, reply) => {
    let error: AgentError = raw;
    if (raw.code === 'FST_ERR_CTP_BODY_TOO_LARGE') error = new AgentErrors.AGT_ERR_BODY_TOO_LARGE(bodyLimit);
    else if (typeof raw.code === 'string' && hasOwnKey(FRAMEWORK_CODES, raw.code))
      error = ownValue(FRAMEWORK_CODES, raw.code)!();
    else if (raw instanceof SyntaxError && raw.statusCode === 400)
      error = new AgentErrors.AGT_ERR_MALFORMED_JSON();
    const status = error.statusCode ?? 500;
    const known = typeof error.code === 'string' && error.code.startsWith('AGT_ERR_');
    reply.header('x-request-id', request.id);
    if (status >= 500 && !(known && status === 503)) {
      log.error({ err: raw, reqId: request.id }, 'request failed');
      metrics.requestErrors.labels('AGT_ERR_INTERNAL').inc();
      return sendProblem(reply, errorProblem(500, 'AGT_ERR_INTERNAL', 'Internal error'));
    }
    const code = known ? error.code : 'AGT_ERR_INVALID_REQUEST';
    // Shed after admission (the home region of a strict policy was overloaded): the same answer as at the door.
    const retryAfter = errorRetryAfter(code, overloadRetryAfterMs);
    if (retryAfter !== undefined) reply.header('retry-after', String(retryAfter));
    metrics.requestErrors.labels(code).inc();
    return sendProblem(reply, errorProblem(status, code, error.message, error.errors, error.shed));
  });
  app.setNotFoundHandler((request, reply) => {
    const error = new AgentErrors.AGT_ERR_NOT_FOUND(request.method, request.url.split('?')[0]);
    metrics.requestErrors.labels(error.code).inc();
    reply.header('x-request-id', request.id);
    return sendProblem(reply, errorProblem(404, error.code, error.message));
  });
}
