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
import type { EngineFactory, Leadership, ProtocolService, ReadinessProbe } from './ports.js';
import { LeaderLease, type LostReason } from './leadership/leader-lease.js';
import { highestRecordEpoch } from './leadership/record-epochs.js';
import { kvNames } from '../core/wire/kv.js';
import { StartSteps } from './start-steps.js';

export interface RunningCoordinator {
  readonly app: CoordinatorApp;
  readonly nc: NatsConnection;
  readonly stores: CoordinatorStores;
  /** The leader lease this coordinator holds; undefined without election. */
  readonly leader: LeaderLease | undefined;
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
  /** Told when this coordinator loses the leader lease (main.ts exits, to start again as a standby). */
  onLeadershipLost?: (reason: LostReason) => void;
  /** Stops a standby's wait for the leader lease (the start then rejects). */
  signal?: AbortSignal;
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
  let lease: LeaderLease | undefined;
  try {
    const metrics = new CoordinatorMetrics({ defaultMetrics: true });
    const clock = options.clock ?? systemClock;
    const steps = new StartSteps({
      log: logger,
      registry: metrics.registry,
      retry: () => lease?.isLeader() === true,
    });
    // A standby waits here, touching nothing, until it holds the leader lease.
    if (config.leader !== undefined) {
      const names = kvNames(config.kvNamespace);
      lease = new LeaderLease({
        nc,
        bucket: names.leader,
        leaseMs: config.leader.leaseMs,
        ...(config.leader.name !== undefined ? { holder: config.leader.name } : {}),
        replicas: config.replicas ?? 1,
        timeoutMs: config.natsTimeoutMs,
        log: logger,
        floor: () => highestRecordEpoch(nc, names.allocations, config.natsTimeoutMs),
      });
      const stopWaiting = () => void lease?.stop();
      options.signal?.addEventListener('abort', stopWaiting, { once: true });
      try {
        await lease.acquire();
      } finally {
        options.signal?.removeEventListener('abort', stopWaiting);
      }
      // What a takeover costs after the lease: counted from here.
      steps.begin();
    }
    const leader: Leadership | undefined =
      lease === undefined
        ? undefined
        : {
            epoch: lease.epoch,
            isLeader: () => lease!.isLeader(),
            fenced: () => void lease!.stop(),
          };
    // A new leader starts while JetStream may still elect the leaders of the lost region's streams (and its meta
    // leader): each call then fails (a timeout, "no responders") until they have. Each step is tried again on its
    // own, for as long as this coordinator leads: the start resumes where it failed, never from the beginning.
    const stores = await openStores(nc, config, {
      clock,
      metrics,
      log: logger,
      steps,
      checkJetStream: lease === undefined,
    });
    logger.debug('coordinator stores open');
    const factory = options.engine;
    const engine: ProtocolService | undefined =
      factory === undefined
        ? undefined
        : await factory({
            nc,
            policies: stores.policies,
            names: stores.names,
            config,
            clock,
            log: logger,
            registry: metrics.registry,
            audit: stores.audit,
            steps,
            ...(leader !== undefined ? { leader } : {}),
          });
    logger.debug('coordinator engine started');
    // What the store read when it opened is for the engine's start only: not kept beyond it.
    stores.policies.takeOpened();
    const readiness: ReadinessProbe = {
      reasons: () => [
        ...stores.readiness.reasons(),
        ...(engine?.reasons?.() ?? []),
        ...(lease !== undefined && !lease.isLeader() ? ['not the leader'] : []),
      ],
    };
    lease?.onLost((reason) => {
      if (reason === 'stopped') return;
      // Stop acting at once: no heartbeat answered, no record written; the process decides what comes next.
      void engine?.stop();
      options.onLeadershipLost?.(reason);
    });
    const app = await buildApp(
      {
        policies: stores.policies,
        audit: stores.audit,
        readiness,
        metrics,
        logger,
        clock,
        ...(engine !== undefined ? { allocations: engine } : {}),
        ...(leader !== undefined ? { leader } : {}),
      },
      config,
    );
    const address = await steps.run('listen', () => app.listen({ host: config.host, port: config.port }));
    const metricsListener =
      config.metricsListener === undefined
        ? undefined
        : await startMetricsListener({ ...config, metricsListener: config.metricsListener }, metrics);
    steps.done(lease === undefined ? {} : { epoch: lease.epoch });
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
        await lease?.stop();
        stores.readiness.close();
        await nc.drain();
      })());
    return { app, nc, stores, leader: lease, url: address, metricsUrl: metricsListener?.url, stop };
  } catch (error) {
    await lease?.stop().catch(() => undefined);
    await nc.close();
    throw error;
  }
}
