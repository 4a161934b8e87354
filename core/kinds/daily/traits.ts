/** The `daily` kind's traits: what it can do and what decides it (core/kinds/kind.ts `KindTraits`). */
import type { KindTraits } from '../kind.js';

/**
 * The longest calendar day, seconds: 25 hours, the day a zone falls back from summer time. A daily budget's idle
 * TTL, which is also how far back a region's lowest share is looked up, covers it: with 24 hours, a region that
 * counted under a large share just after midnight of such a day no longer saw that share near its end, and two
 * regions could count 1.8× the budget in one day while their shares summed to 1 throughout.
 */
export const LONGEST_DAY_SECONDS = 90_000;

/** `daily`: at most `capacity` a calendar day in the policy's `timeZone` (default UTC). */
export const dailyTraits = {
  kind: 'daily',
  decidedBy: 'day',
  rate: 'day',
  promise: 'calendarDay',
  window: undefined,
  wholeUnits: false,
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
  noun: 'a calendar-day budget',
  called: 'a daily budget',
  units: 'units',
  scripts: ['daily_budget', 'daily_budget_refund'],
  refusalReasons: [],
  defaults: { timeZone: 'UTC', minIdleTtlSeconds: LONGEST_DAY_SECONDS },
} as const satisfies KindTraits<'daily'>;
