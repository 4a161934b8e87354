import type { DayStoreCheck, ForwardCheck, LogStoreCheck, PreparedCheck, StoreCheck } from './prepared.js';

/** Store checks whose keys share a cluster slot: one script decides them all-or-nothing. */
export interface StoreGroup {
  kind: 'store';
  /** Positions of the group's checks in the request. */
  indexes: number[];
  checks: StoreCheck[];
  /** Subject of the group's first check: its idempotency record lives in that subject's slot. */
  slotSubject: string;
}

/** Sliding-log checks whose keys share a cluster slot: one `lua/sliding_log.lua` call decides them. */
export interface LogGroup {
  kind: 'log';
  indexes: number[];
  checks: LogStoreCheck[];
  /** Subject of the group's first check: its idempotency record lives in that subject's slot. */
  slotSubject: string;
}

/** Daily-budget checks whose keys share a cluster slot: one `lua/daily_budget.lua` call decides them. */
export interface DayGroup {
  kind: 'day';
  indexes: number[];
  checks: DayStoreCheck[];
  /** Subject of the group's first check: its idempotency record lives in that subject's slot. */
  slotSubject: string;
}

/** The checks forwarded to one home region, decided there all-or-nothing. */
export interface ForwardGroup {
  kind: 'forward';
  indexes: number[];
  checks: ForwardCheck[];
  homeRegion: string;
}

export type CheckGroup = StoreGroup | LogGroup | DayGroup | ForwardGroup;

/**
 * Store checks grouped by slot in order of first appearance (token buckets and sliding logs in groups of their
 * own kind, each decided by its own script), then the forwarded checks (at most one home
 * region per request, checked when it was prepared). Checks routed to their failure mode belong to no group.
 * With `include`, only the checks at positions it accepts are grouped.
 */
export function groupChecks(
  checks: readonly PreparedCheck[],
  slotOf: (key: string) => number,
  include?: (index: number) => boolean,
): CheckGroup[] {
  const groups: CheckGroup[] = [];
  const bySlot = new Map<number, StoreGroup>();
  const logsBySlot = new Map<number, LogGroup>();
  const daysBySlot = new Map<number, DayGroup>();
  let forward: ForwardGroup | undefined;
  // One check is the common case: no slot to compute.
  const single = checks.length === 1;
  checks.forEach((p, i) => {
    // Only the checks `include` names (a regroup after some checks moved): positions stay the request's.
    if (include !== undefined && !include(i)) return;
    if (p.route === 'store') {
      const slot = single ? 0 : slotOf(p.bucket.key);
      let group = bySlot.get(slot);
      if (group === undefined) {
        group = { kind: 'store', indexes: [], checks: [], slotSubject: p.subject };
        bySlot.set(slot, group);
        groups.push(group);
      }
      group.indexes.push(i);
      group.checks.push(p);
    } else if (p.route === 'log') {
      const slot = single ? 0 : slotOf(p.log.key);
      let group = logsBySlot.get(slot);
      if (group === undefined) {
        group = { kind: 'log', indexes: [], checks: [], slotSubject: p.subject };
        logsBySlot.set(slot, group);
        groups.push(group);
      }
      group.indexes.push(i);
      group.checks.push(p);
    } else if (p.route === 'day') {
      const slot = single ? 0 : slotOf(p.day.key);
      let group = daysBySlot.get(slot);
      if (group === undefined) {
        group = { kind: 'day', indexes: [], checks: [], slotSubject: p.subject };
        daysBySlot.set(slot, group);
        groups.push(group);
      }
      group.indexes.push(i);
      group.checks.push(p);
    } else if (p.route === 'forward') {
      forward ??= { kind: 'forward', indexes: [], checks: [], homeRegion: p.homeRegion };
      forward.indexes.push(i);
      forward.checks.push(p);
    }
  });
  if (forward !== undefined) groups.push(forward);
  return groups;
}
