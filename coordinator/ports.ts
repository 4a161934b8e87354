/**
 * The coordinator's ports: what the admin API needs from the protocol engine and from its environment. Each has
 * a real implementation (the engine, NATS) and simple ones for tests.
 */
import type { AllocationSummary, RegionSummary } from '../core/admin-wire.js';

/**
 * What the protocol engine (usage reports, rebalancer, leases) shows the admin API. Both methods are called on
 * every request, so they answer from memory.
 */
export interface AllocationsReader {
  /** The allocation in force of every policy the engine knows. */
  allocations(): AllocationSummary[];
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
