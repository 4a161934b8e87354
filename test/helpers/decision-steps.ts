/**
 * The decision path's steps on the model store, without the HTTP app: a router that prepares requests as the
 * service does, and the dependencies a store group or the layered runner is given, for unit tests of one step.
 */
import { randomBytes } from 'node:crypto';
import { trace } from '@opentelemetry/api';
import { pino } from 'pino';
import type { DecisionRequest } from '../../core/wire/agent.js';
import { ManualClock } from '../../core/clock.js';
import type { Policy } from '../../core/policy/policy.js';
import { hasOwnKey } from '../../core/own-keys.js';
import { StaticShareView, type ShareView } from '../../core/shares/shares.js';
import { ANONYMOUS_SUBJECT } from '../../core/models/subject-creation.js';
import type { ShortfallHandler } from '../../regional-agent/decisions/borrowing-port.js';
import { CheckRouter } from '../../regional-agent/decisions/check-router.js';
import { EmergencyBuckets } from '../../regional-agent/decisions/emergency-buckets.js';
import { FailureModes } from '../../regional-agent/decisions/failure-modes.js';
import type { LayeredRunnerDeps } from '../../regional-agent/decisions/layered-runner.js';
import { ModelDecisionStore } from '../../regional-agent/decisions/model-decision-store.js';
import type { PreparedRequest } from '../../regional-agent/decisions/prepared.js';
import { CreationFlights } from '../../regional-agent/decisions/subject-gate.js';
import { AgentMetrics } from '../../regional-agent/observability/metrics.js';
import { StaticPolicySource } from '../../regional-agent/policies/static-policy-source.js';
import { StoreGuard } from '../../regional-agent/resilience/store-guard.js';

export interface DecisionSteps {
  clock: ManualClock;
  store: ModelDecisionStore;
  deps: LayeredRunnerDeps;
  /** Validate and route a request body as the service does. */
  prepare(request: DecisionRequest): PreparedRequest;
  /** Stop the store guard's and the emergency buckets' timers. */
  close(): void;
}

/**
 * The steps over `policies` on a model store in region `us`. `shares`: each policy's share here (default 1);
 * `noLease`: policies not in `shares` have none. `shortfall`: a borrowing port's implementation.
 */
export function decisionSteps(
  policies: readonly Policy[],
  options: { shares?: Record<string, number>; noLease?: boolean; shortfall?: ShortfallHandler } = {},
): DecisionSteps {
  const clock = new ManualClock(1_750_000_000_000);
  const store = new ModelDecisionStore(clock);
  const metrics = new AgentMetrics({ region: 'us' });
  const source = new StaticPolicySource(policies);
  const table = new StaticShareView(options.shares ?? {});
  // Without a lease, only the policies given a share have one.
  const shares: ShareView =
    options.noLease === true
      ? {
          shareFor: (policy) => (hasOwnKey(options.shares, policy) ? table.shareFor(policy) : undefined),
          enter: () => () => undefined,
        }
      : table;
  const guard = new StoreGuard(
    { errorPercent: 50, volumeThreshold: 1000, resetMs: 1000, windowMs: 10_000 },
    metrics,
    trace.getTracer('decision-steps'),
  );
  const emergency = new EmergencyBuckets(clock, { fraction: 0.1, maxBuckets: 100 });
  const router = new CheckRouter(source, shares, {
    region: 'us',
    canForward: false,
    now: () => clock.now(),
    random: () => 0,
  });
  const deps: LayeredRunnerDeps = {
    store,
    guard,
    failures: new FailureModes(emergency, 1000),
    metrics,
    clock,
    idempotencyTtlMs: 60_000,
    creations: new CreationFlights(),
    shortfall: options.shortfall,
    log: pino({ level: 'silent' }),
    region: 'us',
    leaseKey: randomBytes(32),
    // As the service routes a check moved to its policy's shared bucket.
    sharedCheck: (check) => router.route(check.policy, ANONYMOUS_SUBJECT, check.cost),
  };
  return {
    clock,
    store,
    deps,
    prepare: (request) => router.prepare(request),
    close: () => {
      guard.shutdown();
      emergency.close();
    },
  };
}
