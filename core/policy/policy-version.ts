/**
 * When a policy's version moves. A policy's counters live under keys named by its version (core/keys.ts,
 * core/models/sliding-log.ts, core/models/daily-budget.ts); a counter written under one meaning of a unit must never be read
 * under another. So a write that changes the policy's *units* (what one counted unit is, and which counter it
 * lands in) moves it to the next version: decisions switch to fresh keys and the old ones die by their TTL.
 * A budget change (capacity, refill, classes' limits) keeps the version: the counters keep their meaning.
 */
import type { Policy } from './policy.js';
import { ipPrefixesOf } from '../subjects/ip-subject.js';
import { kindOf } from '../kinds/index.js';

/** The largest version a policy may carry (the schema's bound). */
export const MAX_POLICY_VERSION = 1_000_000;

/**
 * The fields that give a policy's units their meaning:
 * - `kind`: what a counter holds (tokens, log entries, slots, a day's total);
 * - `windowSeconds`, `leaseSeconds`: how long a log entry or a slot counts;
 * - `timeZone`: which calendar day a daily counter counts;
 * - `shards`: which slice of the budget one sub-bucket key holds;
 * - `subjectKind`, `ipv4Prefix`, `ipv6Prefix`: what a subject (and so a key) stands for.
 */
export const UNIT_FIELDS = [
  'kind',
  'windowSeconds',
  'leaseSeconds',
  'timeZone',
  'shards',
  'subjectKind',
  'ipv4Prefix',
  'ipv6Prefix',
] as const;
export type UnitField = (typeof UNIT_FIELDS)[number];

type UnitsOf = Pick<Policy, Exclude<UnitField, 'ipv4Prefix' | 'ipv6Prefix'>> & {
  ipv4Prefix?: number | undefined;
  ipv6Prefix?: number | undefined;
};

/** The unit fields as a policy means them, defaults filled (an `ip` policy's prefixes; a daily day's zone). */
function unitsOf(p: UnitsOf): Record<UnitField, string | number | undefined> {
  const prefixes = p.subjectKind === 'ip' ? ipPrefixesOf(p) : undefined;
  return {
    kind: p.kind,
    windowSeconds: p.windowSeconds,
    leaseSeconds: p.leaseSeconds,
    timeZone: kindOf(p.kind).rate === 'day' ? (p.timeZone ?? kindOf(p.kind).defaults.timeZone) : undefined,
    shards: p.shards ?? 1,
    subjectKind: p.subjectKind,
    ipv4Prefix: prefixes?.ipv4Prefix,
    ipv6Prefix: prefixes?.ipv6Prefix,
  };
}

/** The unit fields whose meaning differs between `before` and `after`, in `UNIT_FIELDS` order. */
export function unitChanges(before: UnitsOf, after: UnitsOf): UnitField[] {
  const a = unitsOf(before);
  const b = unitsOf(after);
  return UNIT_FIELDS.filter((f) => a[f] !== b[f]);
}

/** What a replace does to the version: the version to store, and the bump when the units changed. */
export interface VersionOutcome {
  readonly version: number;
  /** Present when the units changed: the version moved from `from` to `to` because of `fields`. */
  readonly bump?: { readonly from: number; readonly to: number; readonly fields: UnitField[] };
}

/**
 * The version a replace of `before` by `after` stores. It never goes down (a lower one would read counters
 * that may have been written under other units): a requested version below the stored one keeps the stored
 * one. When the units change it goes up by at least one: to `requested` if that is higher, else stored + 1.
 * A create (no `before`) stores what was requested. The caller refuses a version above MAX_POLICY_VERSION.
 */
export function nextVersion(
  before: (UnitsOf & { version: number }) | undefined,
  after: UnitsOf & { version: number },
): VersionOutcome {
  if (before === undefined) return { version: after.version };
  const fields = unitChanges(before, after);
  const floor = before.version + (fields.length > 0 ? 1 : 0);
  const version = Math.max(after.version, floor);
  return fields.length > 0 ? { version, bump: { from: before.version, to: version, fields } } : { version };
}
