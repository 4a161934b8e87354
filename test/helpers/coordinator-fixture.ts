/**
 * A coordinator app on a real NATS for integration tests: its own JetStream namespace (so tests never share
 * buckets), both tokens, in-memory engine ports, a silent logger. `await using` closes the app and the client.
 */
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import type { FastifyBaseLogger } from 'fastify';
import { pino } from 'pino';
import { inject } from 'vitest';
import { systemClock, type Clock } from '../../core/clock.js';
import { buildApp, type CoordinatorApp } from '../../coordinator/app.js';
import { grantsFromConfig } from '../../coordinator/auth/tokens.js';
import type { CoordinatorConfig } from '../../coordinator/config.js';
import { CoordinatorMetrics } from '../../coordinator/metrics.js';
import { openStores, type CoordinatorStores } from '../../coordinator/nats/open-stores.js';
import { silentLogger, type AllocationsReader } from '../../coordinator/ports.js';
import { uniquePrefix } from '../harness/fixtures.js';

export const ADMIN_TOKEN = 'admin-token-for-tests-0001';
export const READ_TOKEN = 'read-token-for-tests-00001';
export const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
export const reader = { authorization: `Bearer ${READ_TOKEN}` };

export interface CoordinatorFixture extends AsyncDisposable {
  readonly app: CoordinatorApp;
  readonly nc: NatsConnection;
  readonly stores: CoordinatorStores;
  readonly config: CoordinatorConfig;
  readonly metrics: CoordinatorMetrics;
  close(): Promise<void>;
}

export interface FixtureOptions {
  natsUrl?: string;
  namespace?: string;
  regions?: string[];
  maxPolicies?: number;
  bodyLimitBytes?: number;
  allocations?: AllocationsReader;
  clock?: Clock;
  natsTimeoutMs?: number;
  /** Default: a silent pino logger. */
  logger?: FastifyBaseLogger;
  /** Named tokens beside the admin and read tokens. */
  tokens?: { name: string; role: 'read' | 'write'; token: string }[];
  metricsAuth?: 'none' | 'read';
  metricsListener?: { host: string; port: number };
  refusalsPerMinute?: number;
}

/** A fresh namespace: lower-case, as JetStream names here require. */
export function uniqueNamespace(): string {
  return uniquePrefix('c').toLowerCase();
}

export function testConfig(options: FixtureOptions = {}): CoordinatorConfig {
  return {
    natsServers: [options.natsUrl ?? inject('nats').url],
    regions: options.regions ?? ['us', 'eu', 'ap'],
    tokens: grantsFromConfig(ADMIN_TOKEN, READ_TOKEN, options.tokens ?? []),
    metricsAuth: options.metricsAuth ?? 'none',
    metricsListener: options.metricsListener,
    auditRefusals: { windowMs: 10_000, perMinute: options.refusalsPerMinute ?? 60 },
    host: '127.0.0.1',
    port: 0,
    logLevel: 'silent',
    kvNamespace: options.namespace ?? uniqueNamespace(),
    natsTimeoutMs: options.natsTimeoutMs ?? 2000,
    maxPolicies: options.maxPolicies ?? 1000,
    bodyLimitBytes: options.bodyLimitBytes ?? 16_384,
    audit: { maxRecords: 1000, maxAgeDays: 1, maxBytes: 8 * 1_048_576 },
    shutdownGraceMs: 0,
    protocol: { rebalance: { roundMs: 1000 }, lease: {}, safeShares: undefined },
  };
}

export async function coordinatorFixture(options: FixtureOptions = {}): Promise<CoordinatorFixture> {
  const config = testConfig(options);
  const nc = await connect({
    servers: [...config.natsServers],
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
  });
  const metrics = new CoordinatorMetrics();
  const clock = options.clock ?? systemClock;
  const stores = await openStores(nc, config, { clock, metrics, log: silentLogger });
  const app = await buildApp(
    {
      policies: stores.policies,
      audit: stores.audit,
      readiness: stores.readiness,
      metrics,
      logger: options.logger ?? pino({ level: 'silent' }),
      ...(options.allocations !== undefined ? { allocations: options.allocations } : {}),
    },
    config,
  );
  let closed = false;
  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    await app.close();
    stores.readiness.close();
    if (!nc.isClosed()) await nc.close();
  };
  return { app, nc, stores, config, metrics, close, [Symbol.asyncDispose]: close };
}

export { eventually } from './wait.js';
