/**
 * Whether the agent serves: policies loaded (then the reservation sweep starts and the policy gauge follows
 * changes) and not draining. `policyWatchPlugin` stops the watch and the sweep on close.
 */
import type { FastifyPluginAsync } from 'fastify';
import type { Logger } from 'pino';
import type { PolicySource } from '../policies/policy-source.js';
import { AgentErrors } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { ReservationService } from '../reservations/reservation-service.js';

export interface Serving {
  /** Resolves once policies are known. */
  readonly ready: Promise<void>;
  readonly policiesLoaded: boolean;
  readonly draining: boolean;
  drain(): void;
  /** Throws AGT_ERR_NOT_READY until policies are loaded. */
  assertServing: () => void;
  /** Stop following policy changes. */
  unsubscribe(): void;
}

export function serving(options: {
  policies: PolicySource;
  reservations: ReservationService;
  reservationSweepMs: number;
  metrics: AgentMetrics;
  log: Logger;
}): Serving {
  const { policies, reservations, metrics, log } = options;
  let policiesLoaded = false;
  let draining = false;
  let unsubscribe = (): void => undefined;
  const ready = policies.ready().then(() => {
    policiesLoaded = true;
    if (options.reservationSweepMs > 0 && !draining) reservations.start(options.reservationSweepMs);
    metrics.policies.set(policies.current().size);
    unsubscribe = policies.onChange((current) => {
      metrics.policies.set(current.size);
      metrics.policyReloads.labels('ok').inc();
      log.info({ policies: current.size }, 'policies changed');
    });
  });
  ready.catch((error: unknown) => log.error({ err: error }, 'policies could not be loaded'));
  return {
    ready,
    get policiesLoaded() {
      return policiesLoaded;
    },
    get draining() {
      return draining;
    },
    drain: () => {
      draining = true;
    },
    assertServing: () => {
      if (!policiesLoaded) throw new AgentErrors.AGT_ERR_NOT_READY('policies are not loaded yet');
    },
    unsubscribe: () => unsubscribe(),
  };
}

/** On close: stop following policy changes, then stop the reservation sweep (waiting for a sweep under way). */
export function policyWatchPlugin(state: Serving, reservations: ReservationService): FastifyPluginAsync {
  return (scope) => {
    scope.addHook('onClose', async () => {
      state.unsubscribe();
      await reservations.stop();
    });
    return Promise.resolve();
  };
}
