/**
 * Start a coordinator from its configuration: connect to NATS, open the JetStream state, build the app, listen.
 * `stop()` shuts down gracefully: not ready first, then stop accepting and finish requests in flight, then
 * stop the protocol engine, then drain NATS. Used by `main.ts` and by whatever runs a coordinator inside a larger
 * process.
 */
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { pino } from 'pino';
import { systemClock, type Clock } from '../core/clock.js';
import { buildApp, type CoordinatorApp } from './app.js';
import type { CoordinatorConfig } from './config.js';
import { CoordinatorMetrics } from './metrics.js';
import { openStores, type CoordinatorStores } from './nats/open-stores.js';
import type { CoordinatorEngine, EngineFactory, ReadinessProbe } from './ports.js';

export interface RunningCoordinator {
  readonly app: CoordinatorApp;
  readonly nc: NatsConnection;
  readonly stores: CoordinatorStores;
  /** `http://host:port` the admin API listens on. */
  readonly url: string;
  /** Graceful shutdown; safe to call more than once. */
  stop(): Promise<void>;
}

export interface StartOptions {
  clock?: Clock;
  /** Builds the protocol engine (usage reports, rebalancer, leases); without one, allocations are empty. */
  engine?: EngineFactory;
}

export async function startCoordinator(
  config: CoordinatorConfig,
  options: StartOptions = {},
): Promise<RunningCoordinator> {
  const logger = pino({
    level: config.logLevel,
    redact: ['req.headers.authorization', 'req.headers.cookie'],
  });
  const nc = await connect({
    servers: [...config.natsServers],
    name: 'quotaplane-coordinator',
    maxReconnectAttempts: -1,
    reconnectTimeWait: 500,
  });
  try {
    const metrics = new CoordinatorMetrics({ defaultMetrics: true });
    const clock = options.clock ?? systemClock;
    const stores = await openStores(nc, config, { clock, metrics, log: logger });
    const engine: CoordinatorEngine | undefined =
      options.engine === undefined
        ? undefined
        : await options.engine({
            nc,
            policies: stores.policies,
            names: stores.names,
            config,
            clock,
            log: logger,
            registry: metrics.registry,
          });
    const readiness: ReadinessProbe = {
      reasons: () => [...stores.readiness.reasons(), ...(engine?.reasons?.() ?? [])],
    };
    const app = await buildApp(
      {
        policies: stores.policies,
        audit: stores.audit,
        readiness,
        metrics,
        logger,
        ...(engine !== undefined ? { allocations: engine } : {}),
      },
      config,
    );
    const address = await app.listen({ host: config.host, port: config.port });
    let stopping: Promise<void> | undefined;
    const stop = (): Promise<void> =>
      (stopping ??= (async () => {
        app.lifecycle.beginDrain();
        if (config.shutdownGraceMs > 0) await new Promise((r) => setTimeout(r, config.shutdownGraceMs));
        await app.close();
        await engine?.stop();
        stores.readiness.close();
        await nc.drain();
      })());
    return { app, nc, stores, url: address, stop };
  } catch (error) {
    await nc.close();
    throw error;
  }
}
