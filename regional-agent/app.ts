/**
 * The regional agent's HTTP service: `buildApp(deps, config)` wires the decision path and its routes around
 * ports it is given (store, policies, shares, clock, logger), so tests build it with real or fake parts and
 * `main.ts` alone reads the environment and listens.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import proxyAddr from '@fastify/proxy-addr';
import { trace, type Tracer } from '@opentelemetry/api';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../core/clock.js';
import { leaseKeyFrom, MAX_LEASE_TOKEN_LENGTH } from '../core/concurrency.js';
import { ownValue } from '../core/own-keys.js';
import type { PolicySource } from '../core/policy-source.js';
import type { ShareView } from '../core/shares.js';
import type { AgentConfig } from './config.js';
import type { DecisionStore } from './decisions/decision-store.js';
import { DecisionService, type ShortfallHandler, type UsageSink } from './decisions/decision-service.js';
import { EmergencyBuckets } from './decisions/emergency-buckets.js';
import { RefusalMemory, refusalMemoryGauge } from './decisions/refusal-memory.js';
import type { Forwarder } from './decisions/forwarder.js';
import { AgentErrors } from './errors.js';
import { batchRoute } from './http/batch-route.js';
import { decisionsRoute } from './http/decisions-route.js';
import { installErrorHandling } from './http/error-handler.js';
import { errorProblem, sendProblem } from './http/problem.js';
import { explainRoute } from './http/explain-route.js';
import { forwardAuthRoute } from './http/forward-auth-route.js';
import { forwardAuthTrust } from './http/forward-auth-trust.js';
import { healthRoutes } from './http/health-routes.js';
import { leasesRoute } from './http/leases-route.js';
import { grantsRoute } from './http/grants-route.js';
import { ModelGrantStore, RedisGrantStore } from './grants/grant-store.js';
import { ModelDecisionStore } from './decisions/model-decision-store.js';
import { reservationsRoute } from './http/reservations-route.js';
import { RedisDecisionStore } from './redis/decision-store.js';
import { RedisReservationStore } from './redis/reservation-store.js';
import { ModelReservationStore, type ReservationStore } from './reservations/reservation-store.js';
import { ReservationService } from './reservations/reservation-service.js';
import { DEFAULT_RLS_RULES, DescriptorRules } from './grpc/descriptor-rules.js';
import { rlsService, type RlsService } from './grpc/rls-service.js';
import { installAdmission } from './http/admission-hook.js';
import { registerDocs } from './http/docs.js';
import { Admission } from './resilience/admission.js';
import { AgentMetrics } from './observability/metrics.js';
import { StoreGuard } from './resilience/store-guard.js';

/** What the agent is built from. Every port has a real implementation (main.ts) and fakes for tests. */
export interface AgentDeps {
  store: DecisionStore;
  policies: PolicySource;
  shares: ShareView;
  log: Logger;
  clock?: Clock;
  random?: () => number;
  tracer?: Tracer;
  /** Strict mode's forwarder; without one, checks of strict policies homed elsewhere fail with `home_unreachable`. */
  forwarder?: Forwarder;
  metrics?: AgentMetrics;
  /** Counts regional decisions for the coordinator's usage reports. */
  usage?: UsageSink;
  /** Tries to cover a regional check refused for lack of this region's tokens (e.g. by borrowing). */
  shortfall?: ShortfallHandler;
  /** More reasons not to be ready (e.g. no lease yet from the coordinator); empty when there are none. */
  notReady?: () => string[];
  /**
   * Where reservations live; by default Redis beside a RedisDecisionStore's buckets, the model beside any other
   * store.
   */
  reservations?: ReservationStore;
  /** Closes what the caller opened for the agent (Redis, NATS), last on shutdown. */
  onClose?: () => Promise<void>;
}

/** The configuration fields the app uses (everything but where Redis and the policies file are). */
export type AgentAppConfig = Pick<
  AgentConfig,
  | 'region'
  | 'decisionDeadlineMs'
  | 'maxInFlight'
  | 'maxEventLoopDelayMs'
  | 'overloadRetryAfterMs'
  | 'trustedProxies'
  | 'subjectHeader'
  | 'forwardAuthSecret'
  | 'forwardAuthSecretHeader'
  | 'requestIdHeader'
  | 'hmacSecret'
  | 'leaseTokenSecret'
  | 'legacyHeaders'
  | 'logSampleRate'
  | 'bodyLimitBytes'
  | 'idempotencyTtlMs'
  | 'breakerErrorPercent'
  | 'breakerVolumeThreshold'
  | 'breakerResetMs'
  | 'breakerWindowMs'
  | 'emergencyFraction'
  | 'emergencyMaxBuckets'
  | 'rlsRules'
  | 'reservationSweepMs'
  | 'explainRefusals'
>;

export interface AgentApp {
  app: FastifyInstance;
  service: DecisionService;
  metrics: AgentMetrics;
  guard: StoreGuard;
  /** Reserve-then-commit, with its expiry sweep. */
  reservations: ReservationService;
  /** Admission control in front of every decision route (HTTP, gRPC, reservations, leases, explain) and of forwarded strict decisions. */
  admission: Admission;
  /** Resolves once policies are known (the agent is ready unless draining). */
  ready: Promise<void>;
  /** Say not ready from now on (SIGTERM's first step); decisions are still served. */
  drain(): void;
  /** Envoy's rate-limit service on this agent's decision path; `start.ts` serves it over gRPC. */
  rls: RlsService;
  /** Close `listener` with the HTTP listener, before the store and the policy source (the gRPC one). */
  attach(listener: { close(): Promise<void> }): void;
  /** Stop taking requests, finish those in flight, then close the store and the policy source. */
  close(): Promise<void>;
}

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

export function buildApp(deps: AgentDeps, config: AgentAppConfig): AgentApp {
  const clock = deps.clock ?? systemClock;
  const metrics = deps.metrics ?? new AgentMetrics({ region: config.region });
  const log = deps.log;
  const leaseKey = leaseKeyFrom(config, () => randomBytes(32));
  const guard = new StoreGuard(
    {
      errorPercent: config.breakerErrorPercent,
      volumeThreshold: config.breakerVolumeThreshold,
      resetMs: config.breakerResetMs,
      windowMs: config.breakerWindowMs,
    },
    metrics,
    deps.tracer ?? trace.getTracer('quotaplane-regional-agent'),
    (status) =>
      log.warn(
        { state: status.state, cause: status.cause },
        status.state === 'open'
          ? `store circuit breaker opened: ${status.cause?.kind ?? 'failures'}: ${status.cause?.message ?? ''}`
          : `store circuit breaker is ${status.state.replace('_', '-')}`,
      ),
  );
  const admission = new Admission(
    {
      maxInFlight: config.maxInFlight,
      maxEventLoopDelayMs: config.maxEventLoopDelayMs,
      retryAfterMs: config.overloadRetryAfterMs,
    },
    metrics,
  );
  const emergency = new EmergencyBuckets(clock, {
    fraction: config.emergencyFraction,
    maxBuckets: config.emergencyMaxBuckets,
  });
  const refusals = new RefusalMemory(config.explainRefusals);
  refusalMemoryGauge(metrics.registry, refusals);
  const service = new DecisionService(
    {
      store: deps.store,
      guard,
      policies: deps.policies,
      shares: deps.shares,
      emergency,
      metrics,
      clock,
      random: deps.random ?? Math.random,
      log,
      forwarder: deps.forwarder,
      usage: deps.usage,
      shortfall: deps.shortfall,
      refusals,
    },
    {
      region: config.region,
      deadlineMs: config.decisionDeadlineMs,
      hmacSecret: config.hmacSecret,
      leaseKey,
      idempotencyTtlMs: config.idempotencyTtlMs,
      failureRetryAfterMs: config.breakerResetMs,
      logSampleRate: config.logSampleRate,
    },
  );

  const reservations = new ReservationService({
    service,
    store: deps.store,
    reservations:
      deps.reservations ??
      (deps.store instanceof RedisDecisionStore
        ? new RedisReservationStore(deps.store.redis, { timeoutMs: deps.store.timeoutMs })
        : new ModelReservationStore(clock)),
    guard,
    metrics,
    log,
    region: config.region,
    now: () => clock.now(),
  });

  const trusted =
    config.trustedProxies.length > 0 ? proxyAddr.compile([...config.trustedProxies]) : undefined;
  const baseLogger: FastifyBaseLogger = log;
  const app = Fastify({
    loggerInstance: baseLogger,
    // Per-request lines would cost more than the decision; decisions are logged sampled by the service.
    logController: new LogController({ disableRequestLogging: true }),
    // No per-request child logger: routes do not log per request, and a child per request costs an allocation
    // and a serializer lookup on the hot path. Logs carry the request id explicitly where they need it.
    childLoggerFactory: (logger) => logger,
    bodyLimit: config.bodyLimitBytes,
    // Path parameters up to a lease token (core/concurrency.ts MAX_LEASE_TOKEN_LENGTH); Fastify's default is 100.
    routerOptions: { maxParamLength: MAX_LEASE_TOKEN_LENGTH },
    trustProxy: trusted === undefined ? false : [...config.trustedProxies],
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

  let policiesLoaded = false;
  let draining = false;
  let unsubscribe = (): void => undefined;
  const ready = deps.policies.ready().then(() => {
    policiesLoaded = true;
    if (config.reservationSweepMs > 0 && !draining) reservations.start(config.reservationSweepMs);
    metrics.policies.set(deps.policies.current().size);
    unsubscribe = deps.policies.onChange((policies) => {
      metrics.policies.set(policies.size);
      metrics.policyReloads.labels('ok').inc();
      log.info({ policies: policies.size }, 'policies changed');
    });
  });
  ready.catch((error: unknown) => log.error({ err: error }, 'policies could not be loaded'));

  const assertServing = (): void => {
    if (!policiesLoaded) throw new AgentErrors.AGT_ERR_NOT_READY('policies are not loaded yet');
  };

  // Only JSON bodies: a text/plain body is refused (415) rather than parsed as a string.
  app.removeContentTypeParser(['text/plain']);
  installErrorHandling(app, {
    metrics,
    log,
    bodyLimit: config.bodyLimitBytes,
    overloadRetryAfterMs: config.overloadRetryAfterMs,
  });
  installAdmission(app, admission, metrics);
  // The OpenAPI document at /docs; the routes are added in a plugin after it so it sees each one.
  registerDocs(app);
  void app.register((scope: FastifyInstance) => {
    decisionsRoute(scope, { service, legacyHeaders: config.legacyHeaders, assertServing });
    batchRoute(scope, {
      service,
      admission,
      metrics,
      log,
      legacyHeaders: config.legacyHeaders,
      // A batch carries up to MAX_DECISIONS_PER_BATCH bodies: 16 times one request's limit.
      bodyLimit: config.bodyLimitBytes * 16,
      assertServing,
    });
    forwardAuthRoute(scope, {
      service,
      policies: deps.policies,
      legacyHeaders: config.legacyHeaders,
      subjectHeader: config.subjectHeader,
      trust: forwardAuthTrust(config, (address) => trusted !== undefined && trusted(address, 0)),
      assertServing,
    });
    explainRoute(scope, {
      service,
      shares: deps.shares,
      refusals,
      region: config.region,
      assertServing,
    });
    reservationsRoute(scope, { reservations, legacyHeaders: config.legacyHeaders, assertServing });
    // Local grants take from the buckets decisions charge: on Redis, or on the model store's own buckets.
    const grants =
      deps.store instanceof RedisDecisionStore
        ? new RedisGrantStore(deps.store.redis, { timeoutMs: deps.store.timeoutMs })
        : deps.store instanceof ModelDecisionStore
          ? new ModelGrantStore(deps.store.model.buckets, clock)
          : undefined;
    if (grants !== undefined) {
      grantsRoute(scope, {
        service,
        store: grants,
        guard,
        shares: deps.shares,
        metrics,
        assertServing,
      });
    }
    leasesRoute(scope, {
      store: deps.store,
      guard,
      policies: deps.policies,
      metrics,
      region: config.region,
      leaseKey,
      assertServing,
    });
    healthRoutes(scope, {
      metrics,
      readiness: {
        reasons: () => {
          const reasons: string[] = [];
          if (draining) reasons.push('draining');
          if (!policiesLoaded) reasons.push('policies are not loaded');
          if (deps.notReady !== undefined) reasons.push(...deps.notReady());
          return reasons;
        },
        facts: () => ({
          policies: deps.policies.current().size,
          store: guard.state,
          storeBreaker: guard.status,
          inFlight: admission.inFlight,
          region: config.region,
        }),
      },
    });
    return Promise.resolve();
  });

  const rls = rlsService({
    service,
    policies: deps.policies,
    rules: new DescriptorRules(config.rlsRules ?? DEFAULT_RLS_RULES),
    metrics,
    log,
    legacyHeaders: config.legacyHeaders,
    assertServing,
    admission,
  });
  const listeners: { close(): Promise<void> }[] = [];

  let closing: Promise<void> | undefined;
  return {
    app,
    service,
    metrics,
    guard,
    reservations,
    admission,
    ready,
    rls,
    attach: (listener) => {
      listeners.push(listener);
    },
    drain: () => {
      draining = true;
    },
    close: () => {
      closing ??= (async () => {
        draining = true;
        const closed = Promise.all([app.close(), ...listeners.map((l) => l.close())]);
        // A keep-alive connection that was busy when closing began turns idle once its answer is sent; close
        // those as they appear instead of waiting out the keep-alive timeout.
        const sweeper = setInterval(() => app.server.closeIdleConnections(), 25);
        try {
          await closed;
        } finally {
          clearInterval(sweeper);
        }
        unsubscribe();
        await reservations.stop();
        guard.shutdown();
        admission.close();
        emergency.close();
        await deps.policies.close();
        await deps.onClose?.();
      })();
      return closing;
    },
  };
}
