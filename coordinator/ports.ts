/**
 * The coordinator's ports: what the admin API needs from the protocol engine and from its environment. Each has
 * a real implementation (the engine, NATS) and simple ones for tests.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import type { Registry } from 'prom-client';
import type { AllocationSample, AllocationSummary, RegionSummary } from '../core/wire/admin.js';
import type { AuditTrail } from './audit/audit-trail.js';
import type { Clock } from '../core/clock.js';
import type { KvNames } from '../core/wire/kv.js';
import type { CoordinatorConfig } from './config.js';
import type { PolicyStore } from './policies/policy-store.js';
import type { StartSteps } from './start-steps.js';

/**
 * What the protocol engine (usage reports, rebalancer, leases) shows the admin API. Both methods are called on
 * every request, so they answer from memory.
 */
export interface AllocationsReader {
  /** The allocation in force of every policy the engine knows. */
  allocations(): AllocationSummary[];
  /** Recent samples of one policy's allocation, oldest first; undefined for a policy it does not know. */
  history?(policy: string): AllocationSample[] | undefined;
  /** What the engine knows of each region it has heard from; configured regions it has not are filled in. */
  regions(): RegionSummary[];
}

/** An engine that knows nothing yet: no allocations, no region heard from. */
export const noAllocations: AllocationsReader = {
  allocations: () => [],
  regions: () => [],
};

/** Why the coordinator is not ready; ready when the list is empty. */
export interface ReadinessProbe {
  reasons(): string[];
}

/** The structured logger the stores use (pino's signature, so fastify's logger fits). */
export interface Logger {
  error(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  debug(obj: object, msg?: string): void;
}

/** A logger that drops everything. */
export const silentLogger: Logger = {
  error: () => undefined,
  warn: () => undefined,
  info: () => undefined,
  debug: () => undefined,
};

/** What the protocol engine is given when the coordinator starts. */
export interface EngineContext {
  /** The coordinator's NATS connection (reconnects forever; drained after the engine stops). */
  readonly nc: NatsConnection;
  /** Current policies (`list()`) and every change written from now on (`onChange`). */
  readonly policies: PolicyStore;
  /** JetStream names of this deployment, including the bucket reserved for allocations. */
  readonly names: KvNames;
  readonly config: CoordinatorConfig;
  readonly clock: Clock;
  readonly log: Logger;
  /** The coordinator's metrics registry, for the engine's own metrics. */
  readonly registry: Registry;
  /** Where share moves are recorded beside policy changes; none, none recorded. */
  readonly audit?: AuditTrail;
  /**
   * The leader lease this coordinator holds (coordinator/leadership); none without election. The engine stamps
   * its epoch on every record and renewal, answers and writes only while `isLeader()`, and writes allocation
   * records by compare-and-set so a coordinator with an older epoch cannot overwrite a newer one's.
   */
  readonly leader?: Leadership;
  /** Times each JetStream call of the engine's start (coordinator/start-steps.ts); none, none timed. */
  readonly steps?: StartSteps;
}

/** What the engine and the admin API see of the leader lease. */
export interface Leadership {
  /** The epoch this coordinator leads with. */
  readonly epoch: number;
  /** True while it holds the lease (its last renewal sent less than a lease length ago). */
  isLeader(): boolean;
  /** Give up at once: a record with a newer epoch was found (another coordinator leads). */
  fenced(): void;
}

/** The protocol engine as the coordinator runs it: the admin API reads it, shutdown stops it. */
export interface ProtocolService extends AllocationsReader {
  /** Why the engine is not ready (e.g. still loading persisted allocations); empty when ready. */
  reasons?(): string[];
  /** Stop timers and subscriptions; called after the admin API stopped and before NATS is drained. */
  stop(): Promise<void>;
}

/** Builds the engine once NATS and the stores are open. */
export type EngineFactory = (context: EngineContext) => Promise<ProtocolService>;
