/**
 * The `daily` kind's fragment of the policy schema (core/kinds/kind.ts `KindSchema`): its own field, `timeZone`,
 * and the rules of a calendar-day budget. core/policy/policy.ts composes it with the fields every kind has.
 */
import { z } from 'zod';
import { roundDerivedRate } from '../../admin-numbers.js';
import { SECONDS_PER_DAY } from '../../policy/limits.js';
import type { KindLookup, KindSchema, PolicyDraft } from '../kind.js';
import { LONGEST_DAY_SECONDS } from './traits.js';

/** True when `zone` is an IANA time zone this runtime knows (Intl; no table of our own). */
export function isTimeZone(zone: string): boolean {
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: zone });
    return true;
  } catch {
    return false;
  }
}

const fields = {
  /** The IANA time zone whose calendar days a `daily` policy counts (default UTC). */
  timeZone: z.string().min(1).max(64).optional(),
};

type Draft = PolicyDraft & z.output<z.ZodObject<typeof fields>>;

/** Rules of the daily kind: `timeZone` only for it, a real zone, its rate derived, keys living a whole day. */
function checkDaily(p: Draft, ctx: z.RefinementCtx, kinds: KindLookup): void {
  const issue = (path: string, message: string) => ctx.addIssue({ code: 'custom', path: [path], message });
  const traits = kinds.kindOf(p.kind);
  if (traits.rate !== 'day') {
    if (p.timeZone !== undefined)
      issue('timeZone', `timeZone is only for kind ${kinds.kindsWith((k) => k.rate === 'day').join(', ')}`);
    return;
  }
  if (p.timeZone !== undefined && !isTimeZone(p.timeZone)) {
    issue('timeZone', `${p.timeZone} is not an IANA time zone (e.g. Europe/Paris, America/New_York, UTC)`);
  }
  const derived = p.capacity / SECONDS_PER_DAY;
  // The exact rate, or the rate as admin answers show it (what a client read back may send again).
  const shown = roundDerivedRate(derived);
  if (
    p.refillPerSecond !== undefined &&
    Math.abs(p.refillPerSecond - derived) > derived * 1e-9 &&
    p.refillPerSecond !== shown
  ) {
    issue('refillPerSecond', `a daily budget's rate is capacity / 86400 = ${shown}; omit refillPerSecond`);
  }
  if (p.idleTtlSeconds !== undefined && p.idleTtlSeconds < LONGEST_DAY_SECONDS) {
    issue(
      'idleTtlSeconds',
      `a daily budget's idleTtlSeconds must be ≥ ${LONGEST_DAY_SECONDS} s, the longest calendar day (25 h)`,
    );
  }
}

export const dailySchema = {
  fields,
  rules: checkDaily,
} as const satisfies KindSchema;
