/**
 * The agent's decision path, built from its ports and configuration: the store's breaker, admission control, the
 * emergency buckets, the refusal memory, the decision service and reservations. Nothing here listens or closes
 * on its own: `decisionCorePlugin` closes it with the app.
 */
import { randomBytes } from 'node:crypto';
import { trace } from '@opentelemetry/api';
import type { FastifyPluginAsync } from 'fastify';
import { systemClock, type Clock } from '../../core/clock.js';
import { leaseKeyFrom, type LeaseKey } from '../../core/concurrency.js';
import type { AgentAppConfig, AgentDeps } from '../app.js';
import { DecisionService } from '../decisions/decision-service.js';
import type { StoreCompanions } from '../decisions/decision-store.js';
import { EmergencyBuckets } from '../decisions/emergency-buckets.js';
import { RefusalMemory, refusalMemoryGauge } from '../decisions/refusal-memory.js';
import type { GrantStore } from '../grants/grant-store.js';
import { AgentMetrics } from '../observability/metrics.js';
import { ReservationService } from '../reservations/reservation-service.js';
import { ModelReservationStore } from '../reservations/reservation-store.js';
import { Admission } from '../resilience/admission.js';
import { StoreGuard } from '../resilience/store-guard.js';

export interface DecisionCore {
  clock: Clock;
  metrics: AgentMetrics;
  guard: StoreGuard;
  admission: Admission;
  emergency: EmergencyBuckets;
  refusals: RefusalMemory;
  service: DecisionService;
  reservations: ReservationService;
  /** Local grants on the store's own buckets; none when the store keeps no companions. */
  grants: GrantStore | undefined;
  /** Key of the MAC on concurrency lease tokens. */
  leaseKey: LeaseKey;
}

export function decisionCore(deps: AgentDeps, config: AgentAppConfig): DecisionCore {
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
  // What the store keeps beside its buckets (Redis beside Redis, the model beside the model); a store that
  // keeps nothing gets reservations in memory and no grants.
  const companions: Partial<StoreCompanions> = deps.store.companions?.(clock) ?? {};
  const reservations = new ReservationService({
    service,
    store: deps.store,
    reservations: deps.reservations ?? companions.reservations ?? new ModelReservationStore(clock),
    guard,
    metrics,
    log,
    region: config.region,
    now: () => clock.now(),
  });
  return {
    clock,
    metrics,
    guard,
    admission,
    emergency,
    refusals,
    service,
    reservations,
    grants: companions.grants,
    leaseKey,
  };
}

/** Closes the decision path once requests are done: the breaker, admission control, the emergency buckets. */
export function decisionCorePlugin(core: DecisionCore): FastifyPluginAsync {
  return (scope) => {
    scope.addHook('onClose', () => {
      core.guard.shutdown();
      core.admission.close();
      core.emergency.close();
      return Promise.resolve();
    });
    return Promise.resolve();
  };
}
