/** The `sliding_log` kind's traits: what it can do and what decides it (core/kinds/kind.ts `KindTraits`). */
import type { KindTraits } from '../kind.js';

/** `sliding_log`: at most `capacity` events in any rolling `windowSeconds` (one entry per admitted unit). */
export const slidingLogTraits = {
  kind: 'sliding_log',
  decidedBy: 'log',
  rate: 'window',
  promise: 'rolling',
  window: 'windowSeconds',
  wholeUnits: true,
  borrows: false,
  shards: false,
  newSubjects: false,
  classes: true,
  grants: false,
  reservations: true,
  leases: false,
  dryRun: true,
  idempotency: true,
  strictMode: true,
  emergencyBucket: false,
  noun: 'an exact rolling window',
  called: 'a sliding log',
  units: 'events',
  scripts: ['sliding_log', 'sliding_log_refund'],
  refusalReasons: [],
  defaults: { timeZone: undefined, minIdleTtlSeconds: undefined },
} as const satisfies KindTraits<'sliding_log'>;
