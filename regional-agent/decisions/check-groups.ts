/**
 * How the checks of one request are split into the calls that decide them: per cluster slot and store group
 * (token buckets, sliding logs, daily budgets), and the checks forwarded to their home region.
 */
import { hashTag } from '../../core/keys.js';
import type { Check } from './check.js';
import type { DayStoreCheck, ForwardCheck, LogStoreCheck, StoreCheck } from './prepared.js';

/** Store checks whose keys share a cluster slot: one script decides them all-or-nothing. */
export interface StoreGroup {
  kind: 'store';
  /** The group's checks, in request order. */
  checks: Check<StoreCheck>[];
  /**
   * Hash tag of the group's first bucket: its idempotency record lives in that slot. The check's subject, or for a
   * sharded policy its sub-bucket's (`subject#k`), whose slot is another one.
   */
  slotSubject: string;
}

/** Sliding-log checks whose keys share a cluster slot: one `lua/sliding_log.lua` call decides them. */
export interface LogGroup {
  kind: 'log';
  checks: Check<LogStoreCheck>[];
  /** Subject of the group's first check: its idempotency record lives in that subject's slot. */
  slotSubject: string;
}

/** Daily-budget checks whose keys share a cluster slot: one `lua/daily_budget.lua` call decides them. */
export interface DayGroup {
  kind: 'day';
  checks: Check<DayStoreCheck>[];
  /** Subject of the group's first check: its idempotency record lives in that subject's slot. */
  slotSubject: string;
}

/** The checks forwarded to one home region, decided there all-or-nothing. */
export interface ForwardGroup {
  kind: 'forward';
  checks: Check<ForwardCheck>[];
  homeRegion: string;
}

/**
 * Strict checks homed in this region, of a request that holds other checks too: decided as their own request, as
 * this region decides them when another region forwards the same request here (layered-runner.ts).
 */
export interface HomeGroup {
  kind: 'home';
  checks: Check[];
}

export type CheckGroup = StoreGroup | LogGroup | DayGroup | ForwardGroup | HomeGroup;

/** Where a store check's idempotency record lives: its subject's slot, or a sharded check's sub-bucket's. */
function slotSubjectOf(p: StoreCheck): string {
  return p.policy.shards === undefined ? p.subject : hashTag(p.bucket.key);
}

/**
 * Store checks grouped by slot in order of first appearance (token buckets and sliding logs in groups of their
 * own kind, each decided by its own script), then the forwarded checks (at most one home
 * region per request, checked when it was prepared). Checks routed to their failure mode belong to no group.
 * With `include`, only the checks it accepts are grouped.
 */
export function groupChecks(
  checks: readonly Check[],
  slotOf: (key: string) => number,
  include?: ReadonlySet<Check>,
): CheckGroup[] {
  // The common case, one token-bucket check: its group, without the maps that sort several by slot.
  const only = checks.length === 1 ? checks[0] : undefined;
  if (only?.prepared.route === 'store' && (include === undefined || include.has(only))) {
    return [
      { kind: 'store', checks: [only as Check<StoreCheck>], slotSubject: slotSubjectOf(only.prepared) },
    ];
  }
  const groups: CheckGroup[] = [];
  const bySlot = new Map<number, StoreGroup>();
  const logsBySlot = new Map<number, LogGroup>();
  const daysBySlot = new Map<number, DayGroup>();
  let forward: ForwardGroup | undefined;
  // One check is the common case: no slot to compute.
  const single = checks.length === 1;
  for (const c of checks) {
    // Only the checks `include` names (a regroup after some checks moved).
    if (include !== undefined && !include.has(c)) continue;
    // Each branch narrows the check's route, so the check is the group's kind of check.
    const p = c.prepared;
    if (p.route === 'store') {
      const slot = single ? 0 : slotOf(p.bucket.key);
      let group = bySlot.get(slot);
      if (group === undefined) {
        group = { kind: 'store', checks: [], slotSubject: slotSubjectOf(p) };
        bySlot.set(slot, group);
        groups.push(group);
      }
      group.checks.push(c as Check<StoreCheck>);
    } else if (p.route === 'log') {
      const slot = single ? 0 : slotOf(p.log.key);
      let group = logsBySlot.get(slot);
      if (group === undefined) {
        group = { kind: 'log', checks: [], slotSubject: p.subject };
        logsBySlot.set(slot, group);
        groups.push(group);
      }
      group.checks.push(c as Check<LogStoreCheck>);
    } else if (p.route === 'day') {
      const slot = single ? 0 : slotOf(p.day.key);
      let group = daysBySlot.get(slot);
      if (group === undefined) {
        group = { kind: 'day', checks: [], slotSubject: p.subject };
        daysBySlot.set(slot, group);
        groups.push(group);
      }
      group.checks.push(c as Check<DayStoreCheck>);
    } else if (p.route === 'forward') {
      forward ??= { kind: 'forward', checks: [], homeRegion: p.homeRegion };
      forward.checks.push(c as Check<ForwardCheck>);
    }
  }
  if (forward !== undefined) groups.push(forward);
  return groups;
}
