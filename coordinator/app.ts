/**
 * The coordinator's admin API as a Fastify app, built from its dependencies and settings so tests can build it
 * with real NATS stores and in-memory engine ports. `main.ts` reads the environment and listens.
 */
import { randomUUID } from 'node:crypto';
import Fastify, {
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from 'fastify';
import { serializerCompiler, validatorCompiler, type ZodTypeProvider } from 'fastify-type-provider-zod';
import { systemClock, type Clock } from '../core/clock.js';
import type { AuditTrail } from './audit/audit-trail.js';
import { RefusalRecorder } from './audit/refusal-recorder.js';
import { TokenVerifier } from './auth/tokens.js';
import { DEFAULT_RESTORE_LIMIT_BYTES, type CoordinatorConfig } from './config.js';
import { Errors } from './errors.js';
import { registerAllocationRoutes } from './http/allocation-routes.js';
import { registerAuditRoutes } from './http/audit-routes.js';
import { registerBackupRoutes } from './http/backup-routes.js';
import { registerDashboardRoutes } from './http/dashboard-routes.js';
import { authHooks } from './http/auth-hook.js';
import { registerDocs } from './http/docs.js';
import { registerHealthRoutes } from './http/health-routes.js';
import { registerPolicyRoutes } from './http/policy-routes.js';
import { classify, problemHandler, sendProblem } from './http/problem.js';
import { CoordinatorMetrics } from './metrics.js';
import type { PolicyStore } from './policies/policy-store.js';
import { noAllocations, type AllocationsReader, type Leadership, type ReadinessProbe } from './ports.js';
import { ignoreContentTypeOfBodylessDeletes } from '../common/http/bodyless-delete.js';

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
  /** Time of the audit records the app writes itself (refusals); default the system clock. */
  clock?: Clock;
  /** The leader lease: while this coordinator does not hold it, every write is refused (COORD_ERR_NOT_LEADER). */
  leader?: Pick<Leadership, 'isLeader'>;
}

/** The settings the app itself reads. */
export type CoordinatorAppConfig = Pick<
  CoordinatorConfig,
  | 'regions'
  | 'tokens'
  | 'bodyLimitBytes'
  | 'logLevel'
  | 'metricsAuth'
  | 'metricsListener'
  | 'auditRefusals'
  | 'restoreLimitBytes'
  | 'maxPolicies'
>;

/** Shutdown control: turn not-ready (and refuse new admin requests) before closing. */
export interface Lifecycle {
  readonly draining: boolean;
  /** Requests received and not yet answered (or aborted). */
  readonly inFlight: number;
  beginDrain(): void;
}

export type CoordinatorApp = FastifyInstance & {
  readonly lifecycle: Lifecycle;
  readonly metrics: CoordinatorMetrics;
  /** Refused admin requests on their way to the audit trail (flush() writes the current window). */
  readonly refusals: RefusalRecorder;
};

const REQUEST_ID = /^[\w.:-]{1,128}$/;
const READS = new Set(['GET', 'HEAD', 'OPTIONS']);
const VERSION = '0.1.0';

export async function buildApp(deps: CoordinatorDeps, config: CoordinatorAppConfig): Promise<CoordinatorApp> {
  const metrics = deps.metrics ?? new CoordinatorMetrics();
  let draining = false;
  const open = new Set<object>();
  const lifecycle: Lifecycle = {
    get draining() {
      return draining;
    },
    get inFlight() {
      return open.size;
    },
    beginDrain() {
      draining = true;
    },
  };

  function notFound(request: FastifyRequest, reply: FastifyReply): FastifyReply {
    metrics.problems.inc({ code: 'COORD_ERR_ROUTE_NOT_FOUND' });
    return sendProblem(
      reply,
      request,
      classify(new Errors.ROUTE_NOT_FOUND(request.method, request.url.split('?')[0]), config.bodyLimitBytes),
    );
  }

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
    // A path the router cannot take apart (bad escapes, a segment past its length limit) names no resource: the
    // same 404 problem as any unknown path, not the framework's own JSON.
    frameworkErrors: (_error, request, reply) => {
      notFound(request, reply);
    },
  }).withTypeProvider<ZodTypeProvider>();

  // Bodies are JSON only: a text/plain body is refused with 415 rather than failing validation as a string.
  app.removeContentTypeParser('text/plain');
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  app.setErrorHandler(problemHandler(metrics, config.bodyLimitBytes));
  app.setNotFoundHandler(notFound);

  ignoreContentTypeOfBodylessDeletes(app);
  app.addHook('onRequest', async (request, reply) => {
    reply.header('x-request-id', request.id);
    if (draining && request.url.startsWith('/v1/')) throw new Errors.NOT_READY();
    // A coordinator that lost its lease (a zombie after a partition) changes nothing.
    const leader = deps.leader;
    if (leader !== undefined && !READS.has(request.method) && !leader.isLeader())
      throw new Errors.NOT_LEADER();
  });
  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched';
    const labels = { route, method: request.method };
    metrics.requests.inc({ ...labels, status: String(reply.statusCode) });
    metrics.requestSeconds.observe(labels, reply.elapsedTime / 1000);
  });

  const refusals = new RefusalRecorder({
    audit: deps.audit,
    clock: deps.clock ?? systemClock,
    metrics,
    log: app.log,
    windowMs: config.auditRefusals.windowMs,
    perMinute: config.auditRefusals.perMinute,
  });
  app.addHook('onClose', () => refusals.close());
  const auth = authHooks(new TokenVerifier(config.tokens), metrics, refusals);
  const readiness: ReadinessProbe = {
    reasons: () => (draining ? ['draining', ...deps.readiness.reasons()] : deps.readiness.reasons()),
  };

  await registerDocs(app, VERSION);
  registerHealthRoutes(app, {
    readiness,
    metrics,
    // On a listener of its own, /metrics is served there (metrics-listener.ts) and not here.
    serveMetrics: config.metricsListener === undefined,
    ...(config.metricsAuth === 'read' ? { metricsAuth: auth('read') } : {}),
  });
  registerDashboardRoutes(app);
  registerPolicyRoutes(app, { store: deps.policies, regions: config.regions, auth });
  registerAuditRoutes(app, { audit: deps.audit, auth, metrics });
  registerBackupRoutes(app, {
    store: deps.policies,
    audit: deps.audit,
    regions: config.regions,
    maxPolicies: config.maxPolicies ?? Number.MAX_SAFE_INTEGER,
    bodyLimitBytes: config.restoreLimitBytes ?? DEFAULT_RESTORE_LIMIT_BYTES,
    auth,
  });
  registerAllocationRoutes(app, {
    allocations: deps.allocations ?? noAllocations,
    regions: config.regions,
    auth,
  });
  // Counted so a stop can close every connection once nothing is being answered (server.ts).
  // A set rather than a count: an aborted request may also reach onResponse, and must leave once.
  app.addHook('onRequest', (request, _reply, done) => {
    open.add(request);
    done();
  });
  app.addHook('onResponse', (request, _reply, done) => {
    open.delete(request);
    done();
  });
  app.addHook('onRequestAbort', (request, done) => {
    open.delete(request);
    done();
  });
  app.decorate('lifecycle', lifecycle);
  app.decorate('metrics', metrics);
  app.decorate('refusals', refusals);
  await app.ready();
  return app as unknown as CoordinatorApp;
}
