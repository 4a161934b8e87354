/**
 * The `sliding_log` kind's fragment of the policy schema (core/kinds/kind.ts `KindSchema`): its window,
 * `windowSeconds`. Its rules are those of every kind whose rate comes from a window (core/policy/policy.ts
 * `checkRate`, read from the traits: the window required, whole units, the derived rate).
 */
import { z } from 'zod';
import type { KindSchema } from '../kind.js';

/** Longest rolling window of a sliding-log policy: one day (keys live one window after their last event). */
export const MAX_WINDOW_SECONDS = 24 * 3600;

export const slidingLogSchema = {
  fields: {
    /** Rolling window of a sliding-log policy, whole seconds; only for `kind: 'sliding_log'`. */
    windowSeconds: z.number().int().positive().max(MAX_WINDOW_SECONDS).optional(),
  },
} as const satisfies KindSchema;
