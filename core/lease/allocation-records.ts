/**
 * The lease coordinator's state as persisted: one allocation record per policy (default vector, overrides,
 * pending shrinks, watch list), and back from a record after a restart.
 */
import type { Policy } from '../policy/policy.js';
import { ownRecordOf, ownValue, setOwn } from '../own-keys.js';
import type { AllocationRecord, UnitRecord } from '../wire/protocol.js';
import type { PolicyState, Unit } from './allocation-state.js';

/** Shares by region name. */
export function byRegion(regions: readonly string[], shares: readonly number[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (let i = 0; i < regions.length; i++) setOwn(out, regions[i]!, shares[i]!);
  return out;
}

/** Note the shares of `unit` issued at `now`, and forget points wholly older than `windowMs` before it. */
export function noteIssued(unit: Unit, now: number, windowMs: number): void {
  const h = (unit.issued ??= []);
  const last = h[h.length - 1];
  if (last === undefined || last.shares.some((s, r) => s !== unit.shares[r])) {
    h.push({ at: now, shares: [...unit.shares] });
  }
  const horizon = now - windowMs;
  while (h.length > 1 && h[1]!.at <= horizon) h.shift();
}

/**
 * The lowest share of each region issued within `windowMs` before `now` (the shares in force at the window's
 * start included), where below the share issued now; undefined elsewhere.
 */
export function lowestIssued(unit: Unit, now: number, windowMs: number): (number | undefined)[] {
  const h = unit.issued ?? [];
  const horizon = now - windowMs;
  return unit.shares.map((share, r) => {
    let lowest = share;
    for (let i = 0; i < h.length; i++) {
      const next = h[i + 1];
      if (next !== undefined && next.at <= horizon) continue; // wholly before the window
      lowest = Math.min(lowest, h[i]!.shares[r] ?? 0);
    }
    return lowest < share ? lowest : undefined;
  });
}

function unitRecord(
  regions: readonly string[],
  unit: Unit,
  now: number,
  windowMs: number,
  withLowest: boolean,
): UnitRecord {
  const pending: Record<string, number> = {};
  unit.pending.forEach((p, r) => {
    if (p !== undefined) setOwn(pending, regions[r]!, p);
  });
  noteIssued(unit, now, windowMs);
  const lowest = lowestIssued(unit, now, windowMs);
  unit.writtenLowest = withLowest ? lowest : undefined;
  const below: Record<string, number> = {};
  lowest.forEach((l, r) => {
    if (l !== undefined) setOwn(below, regions[r]!, l);
  });
  return {
    shares: byRegion(regions, unit.shares),
    pending,
    epoch: unit.epoch,
    ...(withLowest && Object.keys(below).length > 0 ? { lowest: below } : {}),
  };
}

/** The window over which a policy's record carries the lowest shares: its idle TTL, padded by the skew twice. */
export function lowestWindowMs(state: PolicyState, skewMs: number): number {
  return state.policy.idleTtlSeconds * 1000 + 2 * skewMs;
}

/**
 * True when the lowest shares of `unit` at `now` differ from what its last record carried (a point aged out), or
 * it carried some and `legacy` agents (which refuse the field) are registered now.
 */
export function lowestChanged(unit: Unit, now: number, windowMs: number, legacy = false): boolean {
  const written = unit.writtenLowest;
  if (written === undefined) return false;
  if (legacy) return written.some((l) => l !== undefined);
  const current = lowestIssued(unit, now, windowMs);
  return current.some((l, r) => l !== written[r]);
}

/** The record of one policy as of now. */
export function policyRecord(
  regions: readonly string[],
  safe: readonly number[],
  state: PolicyState,
  now: number = state.updatedAt,
  windowMs: number = state.policy.idleTtlSeconds * 1000,
  /** Carry `lowest` (false while an agent from before it is registered: its strict schema would refuse it). */
  withLowest = true,
): AllocationRecord {
  return {
    policy: state.policy.name,
    version: state.policy.version,
    epoch: state.epoch,
    safe: byRegion(regions, safe),
    idleTtlSeconds: state.policy.idleTtlSeconds,
    default: unitRecord(regions, state.base, now, windowMs, withLowest),
    overrides: ownRecordOf(
      [...state.overrides].map(([s, u]) => [s, unitRecord(regions, u, now, windowMs, withLowest)]),
    ),
    ...(state.watch.length > 0 ? { watch: [...state.watch] } : {}),
    updatedAt: state.updatedAt,
  };
}

/** A unit as a record at KV `revision` left it; the revision carries every pending shrink. */
export function restoredUnit(regions: readonly string[], u: UnitRecord, revision: number, now: number): Unit {
  const pending = regions.map((r) => ownValue(u.pending, r));
  const shares = regions.map((r) => ownValue(u.shares, r) ?? 0);
  // The lowest shares the record carried are taken as in force until now: kept for a whole window more (safe).
  const lowest = regions.map((r, i) => Math.min(ownValue(u.lowest, r) ?? shares[i]!, shares[i]!));
  return {
    ...(lowest.some((l, i) => l < shares[i]!)
      ? {
          issued: [
            { at: now, shares: lowest },
            { at: now, shares: [...shares] },
          ],
          writtenLowest: lowest.map((l, i) => (l < shares[i]! ? l : undefined)),
        }
      : {}),
    shares,
    pending,
    pendingRevision: pending.some((p) => p !== undefined) ? revision : undefined,
    pendingSeq: 0,
    pendingSince: now,
    target: undefined,
    moving: false,
    epoch: u.epoch,
  };
}

/**
 * A placeholder for a restored record's policy until the policy store delivers the real one (upsertPolicy); no
 * step runs on its floor of 0 before then because a restarted coordinator is in learning mode.
 */
export function placeholderPolicy(record: AllocationRecord): Policy {
  return {
    kind: 'token_bucket',
    name: record.policy,
    version: record.version,
    capacity: 1,
    refillPerSecond: 1,
    maxCost: 0,
    mode: 'regional',
    onStoreFailure: 'closed',
    idleTtlSeconds: record.idleTtlSeconds,
  } satisfies Policy;
}
