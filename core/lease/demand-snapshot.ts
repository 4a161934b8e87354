/**
 * What a coordinator that takes over needs to carry on rebalancing a policy where the one before left off, as one
 * small record per policy (JetStream KV `<ns>-demand`, written by the leader at a bounded rate): the smoothed
 * demand and unmet demand per region, and the rebalancer's memory of the default vector: for how long its target
 * has been beyond the hysteresis band (the confirmation under way), whether a move is under way and where it was
 * heading. Times are ages relative to `takenAt`, so a reader's own clock places them. The regrowth cool-down is
 * not carried: a successor restores the budget around lapsed agents with shrinks the cool-down never saw anyway,
 * and holding a region with demand in cool-down then hands the budget left over to regions without it (with
 * borrowing off, coordinator-crash fell from 0.57 to 0.43 when it was carried). Pure: the shell reads and writes
 * the KV, this module builds and applies them.
 */
import { z } from 'zod';
import { ownRecord, ownValue, setOwn } from '../own-keys.js';
import { PolicyName, RegionName } from '../policy/policy.js';
import { LeaderEpoch } from '../wire/protocol.js';
import type { PolicyState } from './allocation-state.js';

/** A snapshot older than this is ignored: the confirmation it carries (60 s by default) would be out of date. */
export const DEMAND_SNAPSHOT_MAX_AGE_MS = 60_000;
/** The leader writes a policy's snapshot at most this often. */
export const DEMAND_SNAPSHOT_INTERVAL_MS = 5_000;
/** Largest stored snapshot the coordinator reads (three regions take under 400 bytes). */
export const MAX_DEMAND_SNAPSHOT_BYTES = 4096;
/** Most regions one snapshot may name. */
export const MAX_SNAPSHOT_REGIONS = 32;
/** The key under which a restored region's demand is held until it reports again ('#': never in an agent id). */
export const SNAPSHOT_KEY = '#snapshot';

const Rate = z.number().min(0).max(1e15);
const Share = z.number().min(0).max(1);
const Ms = z.number().int().min(0).max(86_400_000);
const byRegion = <T extends z.ZodType>(value: T) =>
  ownRecord(RegionName, value).refine((r) => Object.keys(r).length <= MAX_SNAPSHOT_REGIONS, {
    message: `at most ${MAX_SNAPSHOT_REGIONS} regions`,
  });

export const DemandSnapshot = z.strictObject({
  v: z.literal(1),
  policy: PolicyName,
  /** The default vector's epoch when taken: its move state applies only to the same shares. */
  epoch: z.number().int().min(0),
  /** The writer's clock (ms) when taken. */
  takenAt: z.number().min(0).max(Number.MAX_SAFE_INTEGER),
  /** Smoothed demand by region, cost per second. */
  demand: byRegion(Rate),
  /** The part of it refused or borrowed, smoothed alike. */
  unmet: byRegion(Rate),
  /** A move of the default vector is under way. */
  moving: z.boolean(),
  /** Its target as of the last round (when there was one). */
  target: byRegion(Share).optional(),
  /** How long the target had been beyond the hysteresis band with room needed, at `takenAt` (at rest only). */
  beyondForMs: Ms.optional(),
  /** Epoch of the leader that wrote it (coordinator/leadership), stamped by the shell like every record. */
  leaderEpoch: LeaderEpoch.optional(),
});
export type DemandSnapshot = z.infer<typeof DemandSnapshot>;

/** Why a stored snapshot was not used (or `restored`). */
export type SnapshotOutcome = 'restored' | 'stale' | 'future' | 'unknown_policy' | 'no_regions';

const compact = (x: number) => Number(x.toPrecision(6));

/** The snapshot of `state` at `now`. */
export function takeDemandSnapshot(
  regions: readonly string[],
  state: PolicyState,
  now: number,
): DemandSnapshot {
  const zeros = () => regions.map(() => 0);
  const demand = state.demand.sumByTag(now, zeros());
  const unmet = state.unmet.sumByTag(now, zeros());
  const base = state.base;
  const map = (values: readonly (number | undefined)[], f: (x: number) => number) => {
    const out: Record<string, number> = {};
    values.forEach((v, r) => {
      if (v !== undefined) setOwn(out, regions[r]!, f(v));
    });
    return out;
  };
  return {
    v: 1,
    policy: state.policy.name,
    epoch: base.epoch,
    takenAt: Math.round(now),
    demand: map(demand, compact),
    unmet: map(unmet, compact),
    moving: base.moving,
    ...(base.lastIdeal !== undefined && base.lastIdeal.length === regions.length
      ? { target: map(base.lastIdeal, (s) => Math.min(1, Math.max(0, compact(s)))) }
      : {}),
    ...(!base.moving && base.beyondSince !== undefined
      ? { beyondForMs: Math.max(0, Math.round(now - base.beyondSince)) }
      : {}),
  };
}

/** True when a snapshot says nothing a successor could use: no demand, no move, nothing confirming. */
export function emptySnapshot(s: DemandSnapshot): boolean {
  const none = (r: Record<string, number>) => Object.values(r).every((v) => v === 0);
  return none(s.demand) && !s.moving && s.beyondForMs === undefined;
}

/**
 * Seed `state` (just restored from its allocation record) from a snapshot read at `now`. Ignored when older than
 * `maxAgeMs` (`stale`), from more than `skewMs` in the future (`future`), or naming none of `regions`. The demand
 * goes in under one key per region (SNAPSHOT_KEY), observed at the snapshot's time so it decays by the tracker's
 * own rule, and is dropped when the region reports again (`dropSeed`). The move state (under way, target,
 * confirmation) applies only when the default vector is still at the snapshot's epoch (the shares it was about).
 */
export function restoreDemandSnapshot(
  regions: readonly string[],
  state: PolicyState,
  snapshot: DemandSnapshot,
  now: number,
  maxAgeMs: number,
  skewMs: number,
): SnapshotOutcome {
  const age = now - snapshot.takenAt;
  if (age > maxAgeMs) return 'stale';
  if (age < -skewMs) return 'future';
  if (!regions.some((r) => ownValue(snapshot.demand, r) !== undefined)) return 'no_regions';
  const at = now - Math.max(0, age);
  regions.forEach((region, r) => {
    const key = seedKey(r);
    const demand = ownValue(snapshot.demand, region);
    if (demand !== undefined) state.demand.seed(key, demand, at, r);
    const unmet = ownValue(snapshot.unmet, region);
    if (unmet !== undefined) state.unmet.seed(key, unmet, at, r);
  });
  const base = state.base;
  if (snapshot.epoch === base.epoch) {
    base.moving = snapshot.moving;
    const target = regions.map((region) => ownValue(snapshot.target, region));
    base.lastIdeal = target.every((t) => t !== undefined) ? target : undefined;
    base.beyondSince = snapshot.beyondForMs === undefined ? undefined : at - snapshot.beyondForMs;
  }
  return 'restored';
}

/** The demand key a restored snapshot seeds for region `r`. */
export function seedKey(r: number): string {
  return `${r}/${SNAPSHOT_KEY}`;
}

/** Region `r` reported: its own agents' demand replaces what the snapshot seeded. */
export function dropSeed(state: PolicyState, r: number): void {
  const key = seedKey(r);
  state.demand.delete(key);
  state.unmet.delete(key);
}
