/** The `concurrency` kind's traits: what it can do and what decides it (core/kinds/kind.ts `KindTraits`). */
import type { KindTraits } from '../kind.js';

/**
 * `concurrency`: at most `capacity` slots held at once. A log whose window is the lease (`leaseSeconds`): a slot
 * counts until it is released or its lease runs out. Regional or local only: a lease is released in the region
 * that holds it, so a forwarded (strict) acquire would leave its release nowhere to go.
 */
export const concurrencyTraits = {
  kind: 'concurrency',
  decidedBy: 'log',
  rate: 'window',
  promise: 'rolling',
  window: 'leaseSeconds',
  wholeUnits: true,
  borrows: false,
  shards: false,
  newSubjects: false,
  classes: true,
  grants: false,
  reservations: false,
  leases: true,
  dryRun: true,
  idempotency: true,
  strictMode: false,
  emergencyBucket: false,
  noun: 'a slot count',
  called: 'a concurrency policy',
  units: 'slots',
  scripts: ['sliding_log', 'sliding_log_refund'],
  refusalReasons: [],
  defaults: { timeZone: undefined, minIdleTtlSeconds: undefined },
} as const satisfies KindTraits<'concurrency'>;
