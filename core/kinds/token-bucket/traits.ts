/** The `token_bucket` kind's traits: what it can do and what decides it (core/kinds/kind.ts `KindTraits`). */
import type { KindTraits } from '../kind.js';

/** `token_bucket` (the default): a burst of `capacity` tokens refilled at `refillPerSecond`. */
export const tokenBucketTraits = {
  kind: 'token_bucket',
  decidedBy: 'store',
  rate: 'declared',
  promise: 'burst',
  window: undefined,
  wholeUnits: false,
  borrows: true,
  shards: true,
  newSubjects: true,
  classes: true,
  grants: true,
  reservations: true,
  leases: false,
  dryRun: true,
  idempotency: true,
  strictMode: true,
  emergencyBucket: true,
  noun: 'a token bucket',
  called: 'a token bucket',
  units: 'tokens',
  scripts: ['token_bucket', 'refund', 'lend', 'credit', 'grant', 'subject_creation'],
  refusalReasons: ['shard_exhausted', 'subject_flood', 'shared_bucket', 'emergency_bucket'],
  defaults: { timeZone: undefined, minIdleTtlSeconds: undefined },
} as const satisfies KindTraits<'token_bucket'>;
