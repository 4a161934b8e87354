/**
 * The agent's Fastify instance and what every route shares: request ids, trusted proxies, the error and
 * not-found answers, admission control and the OpenAPI document (`httpFramingPlugin`, on the root scope).
 */
import { randomUUID } from 'node:crypto';
import proxyAddr from '@fastify/proxy-addr';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import type { Logger } from 'pino';
import { MAX_LEASE_TOKEN_LENGTH } from '../../core/concurrency.js';
import { ownValue } from '../../core/own-keys.js';
import type { AgentAppConfig } from '../app.js';
import { AgentErrors } from '../errors.js';
import { installAdmission } from '../http/admission-hook.js';
import { envoyForwardAuthUrl } from '../http/forward-auth-route.js';
import { registerDocs } from '../http/docs.js';
import { installErrorHandling } from '../http/error-handler.js';
import { errorProblem, sendProblem } from '../http/problem.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { Admission } from '../resilience/admission.js';

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** Whether a peer address is one of `trustedProxies` (never, when there are none). */
export function trustedProxy(config: Pick<AgentAppConfig, 'trustedProxies'>): (address: string) => boolean {
  if (config.trustedProxies.length === 0) return () => false;
  const trusted = proxyAddr.compile([...config.trustedProxies]);
  return (address) => trusted(address, 0);
}

export function agentFastify(config: AgentAppConfig, metrics: AgentMetrics, log: Logger): FastifyInstance {
  const baseLogger: FastifyBaseLogger = log;
  return Fastify({
    loggerInstance: baseLogger,
    // Per-request lines would cost more than the decision; decisions are logged sampled by the service.
    logController: new LogController({ disableRequestLogging: true }),
    // No per-request child logger: routes do not log per request, and a child per request costs an allocation
    // and a serializer lookup on the hot path. Logs carry the request id explicitly where they need it.
    childLoggerFactory: (logger) => logger,
    bodyLimit: config.bodyLimitBytes,
    // Path parameters up to a lease token (core/concurrency.ts MAX_LEASE_TOKEN_LENGTH); Fastify's default is 100.
    routerOptions: { maxParamLength: MAX_LEASE_TOKEN_LENGTH },
    trustProxy: config.trustedProxies.length === 0 ? false : [...config.trustedProxies],
    // Envoy ext_authz appends the client's path and sends its method: routed as the route's own GET.
    rewriteUrl: (req) => envoyForwardAuthUrl(req),
    requestIdHeader: false,
    genReqId: (req) => {
      const sent = ownValue(req.headers, config.requestIdHeader);
      return typeof sent === 'string' && REQUEST_ID.test(sent) ? sent : randomUUID();
    },
    // A path the router cannot take apart: a parameter past its length (a forged lease token) is 414 with a
    // stable code, a bad escape names no route; never the framework's own JSON.
    frameworkErrors: (error, request, reply) => {
      const problem =
        error.code === 'FST_ERR_MAX_PARAM_LENGTH'
          ? new AgentErrors.AGT_ERR_URI_TOO_LONG(MAX_LEASE_TOKEN_LENGTH)
          : new AgentErrors.AGT_ERR_NOT_FOUND(request.method, request.url.split('?')[0]);
      metrics.requestErrors.labels(problem.code).inc();
      reply.header('x-request-id', request.id);
      void sendProblem(reply, errorProblem(problem.statusCode ?? 400, problem.code, problem.message));
    },
    return503OnClosing: true,
    forceCloseConnections: 'idle',
  });
}

/**
 * JSON bodies only, problem answers for every error, admission control, and the OpenAPI document at /docs
 * (registered before the route groups so it sees each one).
 */
export function httpFramingPlugin(options: {
  config: AgentAppConfig;
  metrics: AgentMetrics;
  admission: Admission;
  log: Logger;
}) {
  const { config, metrics, admission, log } = options;
  return fp((app: FastifyInstance) => {
    // Only JSON bodies: a text/plain body is refused (415) rather than parsed as a string.
    app.removeContentTypeParser(['text/plain']);
    installErrorHandling(app, {
      metrics,
      log,
      bodyLimit: config.bodyLimitBytes,
      overloadRetryAfterMs: config.overloadRetryAfterMs,
    });
    installAdmission(app, admission, metrics);
    registerDocs(app);
    return Promise.resolve();
  });
}
