/**
 * The `concurrency` kind's fragment of the policy schema (core/kinds/kind.ts `KindSchema`): its window, the
 * lease TTL `leaseSeconds`. Its rules are those of every kind whose rate comes from a window (core/policy/policy.ts
 * `checkRate`, read from the traits), and of a kind that may not be strict.
 */
import { z } from 'zod';
import type { KindSchema } from '../kind.js';

/** Longest lease of a concurrency policy: one hour. */
export const MAX_LEASE_SECONDS = 3600;

export const concurrencySchema = {
  fields: {
    /** Lease TTL of a concurrency policy, whole seconds: a slot not released by then comes back. */
    leaseSeconds: z.number().int().positive().max(MAX_LEASE_SECONDS).optional(),
  },
} as const satisfies KindSchema;
