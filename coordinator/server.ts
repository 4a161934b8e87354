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
import { natsClientOptions } from './nats/client-options.js';
import { startMetricsListener } from './http/metrics-listener.js';
import { openStores, type CoordinatorStores } from './nats/open-stores.js';
import type { EngineFactory, ProtocolService, ReadinessProbe } from './ports.js';

export interface RunningCoordinator {
  readonly app: CoordinatorApp;
  readonly nc: NatsConnection;
  readonly stores: CoordinatorStores;
  /** `http://host:port` the admin API listens on. */
  readonly url: string;
  /** `http://host:port` of the metrics listener, when `QP_METRICS_PORT` gives it one. */
  readonly metricsUrl: string | undefined;
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
    ...natsClientOptions(config.natsAuth ?? {}),
    maxReconnectAttempts: -1,
    reconnectTimeWait: 500,
  });
  try {
    const metrics = new CoordinatorMetrics({ defaultMetrics: true });
    const clock = options.clock ?? systemClock;
    const stores = await openStores(nc, config, { clock, metrics, log: logger });
    const engine: ProtocolService | undefined =
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
            audit: stores.audit,
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
        clock,
        ...(engine !== undefined ? { allocations: engine } : {}),
      },
      config,
    );
    const address = await app.listen({ host: config.host, port: config.port });
    const metricsListener =
      config.metricsListener === undefined
        ? undefined
        : await startMetricsListener({ ...config, metricsListener: config.metricsListener }, metrics);
    let stopping: Promise<void> | undefined;
    const stop = (): Promise<void> =>
      (stopping ??= (async () => {
        app.lifecycle.beginDrain();
        if (config.shutdownGraceMs > 0) await new Promise((r) => setTimeout(r, config.shutdownGraceMs));
        // Requests in flight finish; then every connection closes, instead of waiting out the keep-alive or headers
        // timeout: a browser holds connections it never sent a request on (a dashboard left open held a stop for
        // about a minute), which Node does not count as idle.
        const sweeper = setInterval(() => {
          if (app.lifecycle.inFlight === 0) app.server.closeAllConnections();
          else app.server.closeIdleConnections();
        }, 25);
        try {
          await app.close();
        } finally {
          clearInterval(sweeper);
        }
        await metricsListener?.app.close();
        await engine?.stop();
        stores.readiness.close();
        await nc.drain();
      })());
    return { app, nc, stores, url: address, metricsUrl: metricsListener?.url, stop };
  } catch (error) {
    await nc.close();
    throw error;
  }
}
