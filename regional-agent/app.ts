/**
 * The regional agent's HTTP service: `buildApp(deps, config)` wires the decision path and its routes around
 * ports it is given (store, policies, shares, clock, logger), so tests build it with real or fake parts and
 * `main.ts` alone reads the environment and listens.
 *
 * Start-up is a list of Fastify plugins, each owning its part's lifecycle: Fastify loads them in order and runs
 * their `onClose` hooks in reverse, after the HTTP listener has stopped and requests in flight are answered
 * (docs/architecture.md, "Start-up").
 */
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import type { Logger } from 'pino';
import type { Clock } from '../core/clock.js';
import type { PolicySource } from './policies/policy-source.js';
import type { ShareView } from '../core/shares/shares.js';
import type { Tracer } from '@opentelemetry/api';
import type { AgentConfig } from './config.js';
import type { DecisionStore } from './decisions/decision-store.js';
import type { DecisionService, ShortfallHandler, UsageSink } from './decisions/decision-service.js';
import type { Forwarder } from './decisions/forwarder.js';
import { DEFAULT_RLS_RULES, DescriptorRules } from './grpc/descriptor-rules.js';
import { rlsService, type RlsService } from './grpc/rls-service.js';
import type { AgentMetrics } from './observability/metrics.js';
import type { RedisClock } from './redis/redis-clock.js';
import type { TermsUntil } from './terms/terms-until.js';
import type { ReservationService } from './reservations/reservation-service.js';
import type { ReservationStore } from './reservations/reservation-store.js';
import type { Admission } from './resilience/admission.js';
import type { StoreGuard } from './resilience/store-guard.js';
import { decisionCore, decisionCorePlugin } from './startup/decision-core.js';
import { agentFastify, httpFramingPlugin } from './startup/http-server.js';
import { attachedListenersPlugin, ownedResourcesPlugin, type Listener } from './startup/owned.js';
import {
  decisionRoutes,
  grantRoutes,
  healthAndMetricsRoutes,
  leaseRoutes,
  termRoutes,
  type RouteContext,
} from './startup/routes.js';
import { policyWatchPlugin, serving } from './startup/serving.js';

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
  /**
   * Redis TIME of this process's instants (regional-agent/redis/redis-clock.ts): a term's deadline. Without one
   * the agent gives no terms (503 AGT_ERR_TERM_UNAVAILABLE).
   */
  redisClock?: Pick<RedisClock, 'toRedisMicros' | 'toRedisMicrosNewest'>;
  /**
   * Where each term's end is recorded in the region's Redis before it is answered (regional-agent/terms/
   * terms-until.ts). Without one the agent gives no terms (503 AGT_ERR_TERM_UNAVAILABLE).
   */
  termsUntil?: Pick<TermsUntil, 'cover'>;
  /**
   * The restart hold, given by an agent with a coordinator (coordination.ts): `leave` is a decision entered in the
   * share view before any record was applied, so nothing is acknowledged until it is left, once `over` resolves
   * (a predecessor's recorded terms have run out). Closing then waits until every term has run out, before the
   * goodbye. Without one (no coordinator) nothing is held at start.
   */
  restartHold?: { leave: () => void; over: Promise<void> };
  /** Closes what the caller opened for the agent, last on shutdown (after the policy source). */
  onClose?: () => Promise<void>;
  /**
   * Plugins that own what the caller opened (Redis, NATS), each closing its part in an `onClose` hook:
   * registered before every other part, so they close after all of them, the last given first.
   */
  resources?: readonly FastifyPluginAsync[];
}

/** The configuration fields the app uses (everything but where Redis and the policies file are). */
export type AgentAppConfig = Partial<Pick<AgentConfig, 'rateLimitHeaders' | 'terms' | 'termMs'>> &
  Pick<
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
  attach(listener: Listener): void;
  /** Stop taking requests, finish those in flight, then close the store and the policy source. */
  close(): Promise<void>;
}

export function buildApp(deps: AgentDeps, config: AgentAppConfig): AgentApp {
  const core = decisionCore(deps, config);
  const { metrics, service, reservations, admission } = core;
  const state = serving({ ...deps, reservations, reservationSweepMs: config.reservationSweepMs, metrics });
  const listeners: Listener[] = [];
  const routes: RouteContext = { deps, config, core, state };

  // Loaded in this order; closed in reverse, once the HTTP listener is closed and requests are answered.
  const app = agentFastify(config, metrics, deps.log);
  for (const resource of deps.resources ?? []) void app.register(resource);
  void app.register(ownedResourcesPlugin({ policies: deps.policies, onClose: deps.onClose }));
  void app.register(decisionCorePlugin(core));
  void app.register(policyWatchPlugin(state, reservations));
  void app.register(httpFramingPlugin({ config, metrics, admission, log: deps.log }));
  void app.register(decisionRoutes(routes));
  void app.register(grantRoutes(routes));
  void app.register(leaseRoutes(routes));
  void app.register(termRoutes(routes));
  void app.register(healthAndMetricsRoutes(routes));
  void app.register(attachedListenersPlugin(listeners));

  const rls = rlsService({
    service,
    policies: deps.policies,
    rules: new DescriptorRules(config.rlsRules ?? DEFAULT_RLS_RULES),
    metrics,
    log: deps.log,
    legacyHeaders: config.legacyHeaders,
    rateLimitDraft: config.rateLimitHeaders,
    assertServing: state.assertServing,
    admission,
  });
  let closing: Promise<void> | undefined;
  return {
    app,
    service,
    metrics,
    guard: core.guard,
    reservations,
    admission,
    ready: state.ready,
    rls,
    attach: (listener) => void listeners.push(listener),
    drain: () => state.drain(),
    close: () => (closing ??= closeApp(app, state)),
  };
}

/** Not ready at once, then close: Fastify stops the listener, answers what is in flight, and closes each part. */
async function closeApp(app: FastifyInstance, state: { drain(): void }): Promise<void> {
  state.drain();
  const closed = app.close();
  // A keep-alive connection that was busy when closing began turns idle once its answer is sent; close those as
  // they appear instead of waiting out the keep-alive timeout.
  const sweeper = setInterval(() => app.server.closeIdleConnections(), 25);
  try {
    await closed;
  } finally {
    clearInterval(sweeper);
  }
}
