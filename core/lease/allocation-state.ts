/**
 * What the lease coordinator keeps per policy: the allocation units (the policy's default share vector and one
 * per overridden subject) with their pending shrinks, and the demand that moves them. Plain data and small pure
 * helpers; the rules that change it live in lease-coordinator.ts (conservation) and subject-overrides.ts.
 */
import type { Policy } from '../policy/policy.js';
import { DemandTracker } from '../rebalance/demand.js';
import type { RebalanceSettings } from '../rebalance/settings.js';
import { shareFloor } from '../rebalance/target.js';

/** Shares closer than this are equal. */
export const EPSILON = 1e-9;
/** A subject's demand is smoothed over this many times a policy's half-life. */
export const SUBJECT_SMOOTHING = 3;

/**
 * Why a unit's shares last moved, as the coordinator decided it (move records carry it):
 * - `demand`: the rebalancer stepped toward `target`, the shares that follow the smoothed demand.
 * - `lapsed_region`: agents of some region lapsed or went silent; live regions shrank so the claims fit.
 * - `unallocated`: the shares summed below 1 with no step due, and the rest of the budget was handed out.
 * `demand` and `unmet` are the smoothed rates by region (cost per second) the round saw.
 */
export interface MoveCause {
  reason: 'demand' | 'lapsed_region' | 'unallocated';
  demand: readonly number[];
  unmet: readonly number[];
  target: readonly number[] | undefined;
}

/** One allocation unit: a share vector moving under the conservation protocol. */
export interface Unit {
  shares: number[];
  /** Share held before an unacknowledged shrink, by region. */
  pending: (number | undefined)[];
  /** KV revision that carries the pending shrinks (undefined until written). */
  pendingRevision: number | undefined;
  /** Change sequence of the pending shrinks (matches a write to its revision). */
  pendingSeq: number;
  /** Coordinator time at which the pending revision became known (for the acknowledgement deadline). */
  pendingSince: number;
  /** Where a rebalance in flight is heading: grows wait for the shrinks to be acknowledged. */
  target: number[] | undefined;
  /** A rebalance is under way: it continues until within the settle band (hysteresis has two thresholds). */
  moving: boolean;
  /** The target of the last round, to tell whether it is still moving. */
  lastIdeal?: number[] | undefined;
  /** Since when the target has been beyond the hysteresis band with room needed, at rest (the rebalancer's). */
  beyondSince?: number | undefined;
  /** Why its shares last moved; undefined before the first move (or when restored). */
  cause?: MoveCause | undefined;
  epoch: number;
  /**
   * Shares issued (written) over the policy's window, oldest first, one point older than the window (the shares
   * in force at its start): where the record's `lowest` comes from (allocation-records.ts).
   */
  issued?: { at: number; shares: number[] }[] | undefined;
  /** The `lowest` the last record carried, by region (undefined: none below the shares). */
  writtenLowest?: (number | undefined)[] | undefined;
}

/** What the coordinator knows of one subject's demand, for overrides. */
export interface SubjectDemand {
  tracker: DemandTracker<string>;
  lastDeniedAt: number;
  deniedRate: number;
}

/** Everything the coordinator holds for one regional policy. */
export interface PolicyState {
  policy: Policy;
  floor: number;
  base: Unit;
  overrides: Map<string, Unit>;
  reverting: Set<string>;
  epoch: number;
  /** Bumped on every change; a write carries the seq it snapshots. */
  seq: number;
  /**
   * Regions whose share shrank, by change seq, until the write carrying them is confirmed; `at` is when the
   * shrink was issued (its acknowledgement deadline runs from then).
   */
  unwrittenShrinks: { seq: number; regions: number[]; at: number }[];
  demand: DemandTracker<string>;
  /** The part of `demand` refused (demand − admitted), smoothed alike: where room is short. */
  unmet: DemandTracker<string>;
  /**
   * The policy's demand smoothed like a subject's (slower): a subject's shape is compared with this, so a shift
   * of the whole policy, which subjects' slower estimates follow late, does not look like subjects of their own.
   */
  slowDemand: DemandTracker<string>;
  subjects: Map<string, SubjectDemand>;
  /** Subjects agents are asked to report every interval (written in the record). */
  watch: string[];
  /** When each watched subject joined the list: it needs a full report round before it can get an override. */
  watchedSince: Map<string, number>;
  updatedAt: number;
  /** When its demand snapshot was last taken (demand-snapshot.ts), and whether it held nothing. */
  snapshotAt?: number | undefined;
  snapshotEmpty?: boolean | undefined;
}

/** The state of a policy new to the coordinator (or restored), its default vector at `base`. */
export function newPolicyState(
  policy: Policy,
  base: Unit,
  settings: RebalanceSettings,
  now: number,
): PolicyState {
  return {
    policy,
    floor: shareFloor(policy.capacity, policy.maxCost, policy.minShare, settings),
    base,
    overrides: new Map(),
    reverting: new Set(),
    epoch: 0,
    seq: 0,
    unwrittenShrinks: [],
    demand: new DemandTracker(settings.demandHalfLifeMs),
    unmet: new DemandTracker(settings.demandHalfLifeMs),
    slowDemand: new DemandTracker(SUBJECT_SMOOTHING * settings.demandHalfLifeMs),
    subjects: new Map(),
    watch: [],
    watchedSince: new Map(),
    updatedAt: now,
  };
}

/** A unit at rest with these shares. */
export function restingUnit(shares: readonly number[]): Unit {
  return {
    shares: [...shares],
    pending: shares.map(() => undefined),
    pendingRevision: undefined,
    pendingSeq: 0,
    pendingSince: 0,
    target: undefined,
    moving: false,
    epoch: 0,
  };
}

/** A copy of a unit's state exactly (pending shrinks included), at rest and at epoch 0: creating it moves nothing. */
export function copyUnit(unit: Unit): Unit {
  return {
    shares: [...unit.shares],
    pending: [...unit.pending],
    pendingRevision: unit.pendingRevision,
    pendingSeq: unit.pendingSeq,
    pendingSince: unit.pendingSince,
    target: undefined,
    moving: false,
    epoch: 0,
  };
}

/** The unit has shrinks not yet acknowledged. */
export function inFlight(unit: Unit): boolean {
  return unit.pending.some((p) => p !== undefined);
}

/**
 * What region `r` may be deciding with: its issued share, the share it held before an unacknowledged shrink,
 * and its safe share if some agent there may have let its lease lapse.
 */
export function claimOf(unit: Unit, r: number, lapsed: boolean, safe: number): number {
  return Math.max(unit.shares[r]!, unit.pending[r] ?? 0, lapsed ? safe : 0);
}

/** Every allocation unit of a policy, default first. */
export function unitsOf(state: PolicyState): Unit[] {
  return [state.base, ...state.overrides.values()];
}

/** The largest difference between two share vectors. */
export function maxGap(a: readonly number[], b: readonly number[]): number {
  let gap = 0;
  for (let i = 0; i < a.length; i++) gap = Math.max(gap, Math.abs(a[i]! - b[i]!));
  return gap;
}
