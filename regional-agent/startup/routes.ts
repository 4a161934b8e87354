/**
 * The agent's route groups, each a plugin: decisions (single, batch, forward-auth, explain, reservations),
 * local grants (when the store keeps them), concurrency leases, and health with metrics.
 */
import type { FastifyPluginAsync } from 'fastify';
import type { Policy } from '../../core/policy/policy.js';
import { ANSWER_WITHIN_HEADER } from '../../core/wire/agent.js';
import type { AgentAppConfig, AgentDeps } from '../app.js';
import { batchRoute } from '../http/batch-route.js';
import { decisionsRoute } from '../http/decisions-route.js';
import { explainRoute } from '../http/explain-route.js';
import { forwardAuthRoute } from '../http/forward-auth-route.js';
import { forwardAuthTrust } from '../http/forward-auth-trust.js';
import { grantsRoute } from '../http/grants-route.js';
import { healthRoutes } from '../http/health-routes.js';
import { leasesRoute } from '../http/leases-route.js';
import { reservationsRoute } from '../http/reservations-route.js';
import { termsRoute } from '../http/terms-route.js';
import { TermHolds } from '../terms/term-holds.js';
import { DEFAULT_TERM_MS } from '../../core/wire/term.js';
import type { DecisionCore } from './decision-core.js';
import { trustedProxy } from './http-server.js';
import type { Serving } from './serving.js';

export interface RouteContext {
  deps: AgentDeps;
  config: AgentAppConfig;
  core: DecisionCore;
  state: Serving;
}

export function decisionRoutes({ deps, config, core, state }: RouteContext): FastifyPluginAsync {
  const { service, admission, metrics } = core;
  const headers = { legacyHeaders: config.legacyHeaders, rateLimitDraft: config.rateLimitHeaders };
  const assertServing = state.assertServing;
  // How long a decision here may take: the local deadline plus the farthest link's allowance (docs/agent.md,
  // "Timeouts"); a client's timeout must be longer, or it fails decisions the agent makes and charges. Every
  // request reads the forwarder's kept allowance; the header's text is rebuilt only when that changed. The
  // forwarder counts the homes of this agent's strict policies from the start (followForwardHomes), so a home
  // not measured yet is covered before its first forward, not after the client already lowered its timeout.
  let allowance = 0;
  let header = String(config.decisionDeadlineMs);
  const answerWithin = (): string => {
    const now = deps.forwarder?.farthestAllowanceMs?.() ?? 0;
    if (now !== allowance) {
      allowance = now;
      header = String(config.decisionDeadlineMs + now);
    }
    return header;
  };
  return (scope) => {
    followForwardHomes(scope, { deps, config, state });
    scope.addHook('onRequest', (_request, reply, done) => {
      reply.header(ANSWER_WITHIN_HEADER, answerWithin());
      done();
    });
    decisionsRoute(scope, { service, ...headers, assertServing });
    batchRoute(scope, {
      service,
      admission,
      metrics,
      log: deps.log,
      ...headers,
      // A batch carries up to MAX_DECISIONS_PER_BATCH bodies: 16 times one request's limit.
      bodyLimit: config.bodyLimitBytes * 16,
      assertServing,
    });
    const trusted = trustedProxy(config);
    forwardAuthRoute(scope, {
      service,
      policies: deps.policies,
      ...headers,
      subjectHeader: config.subjectHeader,
      trust: forwardAuthTrust(config, trusted),
      trustedAddress: trusted,
      assertServing,
    });
    explainRoute(scope, {
      service,
      shares: deps.shares,
      refusals: core.refusals,
      region: config.region,
      assertServing,
    });
    reservationsRoute(scope, { reservations: core.reservations, ...headers, assertServing });
    return Promise.resolve();
  };
}

/** The regions `policies` forward to from `region`: the homes of its strict policies homed elsewhere. */
export function strictHomesElsewhere(policies: ReadonlyMap<string, Policy>, region: string): Set<string> {
  const homes = new Set<string>();
  for (const policy of policies.values()) {
    if (policy.mode === 'strict' && policy.homeRegion !== undefined && policy.homeRegion !== region)
      homes.add(policy.homeRegion);
  }
  return homes;
}

/**
 * Tell the forwarder which homes this agent's policies may forward to: now, once policies are loaded, and after
 * every change (until the scope closes). A deployment without strict policies homed elsewhere tells it none,
 * and its header stays the deadline alone.
 */
function followForwardHomes(
  scope: Parameters<FastifyPluginAsync>[0],
  { deps, config, state }: Pick<RouteContext, 'deps' | 'config' | 'state'>,
): void {
  const forwarder = deps.forwarder;
  if (forwarder?.expectHomes === undefined) return;
  const tell = (policies: ReadonlyMap<string, Policy>): void =>
    forwarder.expectHomes?.(strictHomesElsewhere(policies, config.region));
  tell(deps.policies.current());
  const unsubscribe = deps.policies.onChange(tell);
  // A source whose first load tells no listener (or whose policies were there before this subscribed).
  state.ready.then(
    () => tell(deps.policies.current()),
    () => undefined,
  );
  scope.addHook('onClose', (_instance, done) => {
    unsubscribe();
    done();
  });
}

/** Local grants take from the buckets decisions charge: only when the store keeps grants beside them. */
export function grantRoutes({ deps, core, state }: RouteContext): FastifyPluginAsync {
  return (scope) => {
    if (core.grants !== undefined) {
      grantsRoute(scope, {
        service: core.service,
        store: core.grants,
        guard: core.guard,
        shares: deps.shares,
        metrics: core.metrics,
        assertServing: state.assertServing,
      });
    }
    return Promise.resolve();
  };
}

export function leaseRoutes({ deps, config, core, state }: RouteContext): FastifyPluginAsync {
  return (scope) => {
    leasesRoute(scope, {
      store: deps.store,
      guard: core.guard,
      policies: deps.policies,
      metrics: core.metrics,
      region: config.region,
      leaseKey: core.leaseKey,
      assertServing: state.assertServing,
    });
    return Promise.resolve();
  };
}

/**
 * Direct-decision terms, and the holds that keep each one entered in the share view until it has run out. With a
 * coordinator (`deps.restartHold`), the restart hold is taken whether terms are on or off (a predecessor of this
 * process may have given terms with them on): it holds every acknowledgement until the predecessor's recorded
 * terms have run out (regional-agent/terms/terms-until.ts; no wait when none is recorded), and closing waits for
 * every hold to run out before the coordinator is told goodbye (term-holds.ts).
 */
export function termRoutes({ deps, config, core, state }: RouteContext): FastifyPluginAsync {
  const termMs = config.termMs ?? DEFAULT_TERM_MS;
  const holds = new TermHolds({
    gauge: core.metrics.termsHeld,
    waitOnClose: deps.restartHold !== undefined,
  });
  if (deps.restartHold !== undefined) holds.holdUntil(deps.restartHold.leave, deps.restartHold.over);
  return (scope) => {
    scope.addHook('onClose', () => holds.close());
    termsRoute(scope, {
      policies: deps.policies,
      shares: deps.shares,
      holds,
      metrics: core.metrics,
      redisClock: deps.redisClock,
      termsUntil: deps.termsUntil,
      usage: deps.usage,
      borrows: deps.shortfall !== undefined,
      terms: config.terms ?? 'off',
      termMs,
      hmacSecret: config.hmacSecret,
      legacyHeaders: config.legacyHeaders,
      rateLimitDraft: config.rateLimitHeaders,
      assertServing: state.assertServing,
      // As a batch's: a renewal's usage is one subject's counts per entry, up to MAX_TERM_USAGE of them.
      bodyLimit: config.bodyLimitBytes * 16,
    });
    return Promise.resolve();
  };
}

/** /livez, /readyz (why not ready, and the facts) and /metrics. */
export function healthAndMetricsRoutes({ deps, config, core, state }: RouteContext): FastifyPluginAsync {
  return (scope) => {
    healthRoutes(scope, {
      metrics: core.metrics,
      readiness: {
        reasons: () => {
          const reasons: string[] = [];
          if (state.draining) reasons.push('draining');
          if (!state.policiesLoaded) reasons.push('policies are not loaded');
          if (deps.notReady !== undefined) reasons.push(...deps.notReady());
          return reasons;
        },
        facts: () => ({
          policies: deps.policies.current().size,
          store: core.guard.state,
          storeBreaker: core.guard.status,
          inFlight: core.admission.inFlight,
          region: config.region,
        }),
      },
    });
    return Promise.resolve();
  };
}
