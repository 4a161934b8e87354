/**
 * The lease coordinator's state as persisted: one allocation record per policy (default vector, overrides,
 * pending shrinks, watch list), and back from a record after a restart.
 */
import type { Policy } from '../policy.js';
import { ownRecordOf, ownValue, setOwn } from '../own-keys.js';
import type { AllocationRecord, UnitRecord } from '../wire/protocol.js';
import type { PolicyState, Unit } from './allocation-state.js';

/** Shares by region name. */
export function byRegion(regions: readonly string[], shares: readonly number[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (let i = 0; i < regions.length; i++) setOwn(out, regions[i]!, shares[i]!);
  return out;
}

function unitRecord(regions: readonly string[], unit: Unit): UnitRecord {
  const pending: Record<string, number> = {};
  unit.pending.forEach((p, r) => {
    if (p !== undefined) setOwn(pending, regions[r]!, p);
  });
  return { shares: byRegion(regions, unit.shares), pending, epoch: unit.epoch };
}

/** The record of one policy as of now. */
export function policyRecord(
  regions: readonly string[],
  safe: readonly number[],
  state: PolicyState,
): AllocationRecord {
  return {
    policy: state.policy.name,
    version: state.policy.version,
    epoch: state.epoch,
    safe: byRegion(regions, safe),
    idleTtlSeconds: state.policy.idleTtlSeconds,
    default: unitRecord(regions, state.base),
    overrides: ownRecordOf([...state.overrides].map(([s, u]) => [s, unitRecord(regions, u)])),
    ...(state.watch.length > 0 ? { watch: [...state.watch] } : {}),
    updatedAt: state.updatedAt,
  };
}

/** A unit as a record at KV `revision` left it; the revision carries every pending shrink. */
export function restoredUnit(regions: readonly string[], u: UnitRecord, revision: number, now: number): Unit {
  const pending = regions.map((r) => ownValue(u.pending, r));
  return {
    shares: regions.map((r) => ownValue(u.shares, r) ?? 0),
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
