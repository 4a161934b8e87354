/**
 * The coordinator's admin API as a Fastify app, built from its dependencies and settings so tests can build it
 * with real NATS stores and in-memory engine ports. `main.ts` reads the environment and listens.
 */
import { randomUUID } from 'node:crypto';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import { serializerCompiler, validatorCompiler, type ZodTypeProvider } from 'fastify-type-provider-zod';
import type { AuditTrail } from './audit/audit-trail.js';
import { grantsFromConfig, TokenVerifier } from './auth/tokens.js';
import type { CoordinatorConfig } from './config.js';
import { Errors } from './errors.js';
import { registerAllocationRoutes } from './http/allocation-routes.js';
import { registerAuditRoutes } from './http/audit-routes.js';
import { authHooks } from './http/auth-hook.js';
import { registerDocs } from './http/docs.js';
import { registerHealthRoutes } from './http/health-routes.js';
import { registerPolicyRoutes } from './http/policy-routes.js';
import { classify, problemHandler, sendProblem } from './http/problem.js';
import { CoordinatorMetrics } from './metrics.js';
import type { PolicyStore } from './policies/policy-store.js';
import { noAllocations, type AllocationsReader, type ReadinessProbe } from './ports.js';

/** What the app runs on. */
export interface CoordinatorDeps {
  policies: PolicyStore;
  audit: AuditTrail;
  /** NATS and buckets; the app adds `draining` itself. */
  readiness: ReadinessProbe;
  /** The protocol engine's view; an empty one until the engine is wired in. */
  allocations?: AllocationsReader;
  metrics?: CoordinatorMetrics;
  /** A logger instance (pino); default: one at `config.logLevel` writing to stdout. */
  logger?: FastifyBaseLogger;
}

/** The settings the app itself reads. */
export type CoordinatorAppConfig = Pick<
  CoordinatorConfig,
  'regions' | 'adminToken' | 'readToken' | 'bodyLimitBytes' | 'logLevel'
>;

/** Shutdown control: turn not-ready (and refuse new admin requests) before closing. */
export interface Lifecycle {
  readonly draining: boolean;
  beginDrain(): void;
}

export type CoordinatorApp = FastifyInstance & {
  readonly lifecycle: Lifecycle;
  readonly metrics: CoordinatorMetrics;
};

const REQUEST_ID = /^[\w.:-]{1,128}$/;
const VERSION = '0.1.0';

export async function buildApp(deps: CoordinatorDeps, config: CoordinatorAppConfig): Promise<CoordinatorApp> {
  const metrics = deps.metrics ?? new CoordinatorMetrics();
  let draining = false;
  const lifecycle: Lifecycle = {
    get draining() {
      return draining;
    },
    beginDrain() {
      draining = true;
    },
  };

  const app = Fastify({
    ...(deps.logger !== undefined
      ? { loggerInstance: deps.logger }
      : {
          logger: {
            level: config.logLevel,
            redact: ['req.headers.authorization', 'req.headers.cookie'],
          },
        }),
    bodyLimit: config.bodyLimitBytes,
    requestIdHeader: false,
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
    },
    // `/v1/policies/` and `/v1/policies` are the same resource.
    routerOptions: { ignoreTrailingSlash: true },
  }).withTypeProvider<ZodTypeProvider>();

  // Bodies are JSON only: a text/plain body is refused with 415 rather than failing validation as a string.
  app.removeContentTypeParser('text/plain');
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  app.setErrorHandler(problemHandler(metrics, config.bodyLimitBytes));
  app.setNotFoundHandler((request, reply) => {
    metrics.problems.inc({ code: 'COORD_ERR_ROUTE_NOT_FOUND' });
    return sendProblem(
      reply,
      request,
      classify(new Errors.ROUTE_NOT_FOUND(request.method, request.url.split('?')[0]), config.bodyLimitBytes),
    );
  });

  app.addHook('onRequest', async (request, reply) => {
    reply.header('x-request-id', request.id);
    if (draining && request.url.startsWith('/v1/')) throw new Errors.NOT_READY();
  });
  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched';
    const labels = { route, method: request.method };
    metrics.requests.inc({ ...labels, status: String(reply.statusCode) });
    metrics.requestSeconds.observe(labels, reply.elapsedTime / 1000);
  });

  const auth = authHooks(new TokenVerifier(grantsFromConfig(config.adminToken, config.readToken)), metrics);
  const readiness: ReadinessProbe = {
    reasons: () => (draining ? ['draining', ...deps.readiness.reasons()] : deps.readiness.reasons()),
  };

  await registerDocs(app, VERSION);
  registerHealthRoutes(app, { readiness, metrics });
  registerPolicyRoutes(app, { store: deps.policies, regions: config.regions, auth });
  registerAuditRoutes(app, { audit: deps.audit, auth, metrics });
  registerAllocationRoutes(app, {
    allocations: deps.allocations ?? noAllocations,
    regions: config.regions,
    auth,
  });
  app.decorate('lifecycle', lifecycle);
  app.decorate('metrics', metrics);
  await app.ready();
  return app as unknown as CoordinatorApp;
}
