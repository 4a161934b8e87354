/**
 * The simulator's settings turned into the core protocol's own settings (core/lease/settings.ts,
 * core/rebalance/settings.ts), parsed by their schemas, with the engine's cross-field rules checked before a run
 * starts, so a bad combination is a clear SimConfigError and not a crash at virtual second 40.
 */
import type { ZodError } from 'zod';
import { borrowReserveMs } from '../../core/borrowing/borrow.js';
import { BorrowPlannerSettings, DEFAULT_BORROW_PLANNER } from '../../core/borrowing/planner.js';
import { LeaseSettings } from '../../core/lease/settings.js';
import type { Policy } from '../../core/policy/policy.js';
import { RebalanceSettings } from '../../core/rebalance/settings.js';
import { shareFloor } from '../../core/rebalance/target.js';
import { SimConfigError } from '../errors.js';
import type { Settings } from '../settings.js';
import type { SimBorrowingOptions } from './sim-borrowing.js';

const issues = (error: ZodError) =>
  error.issues.map((i) => `${i.path.join('.') || 'settings'}: ${i.message}`).join('; ');

/** Rebalancer settings of a run; throws SimConfigError. */
export function rebalanceSettings(s: Settings): RebalanceSettings {
  const parsed = RebalanceSettings.safeParse({
    roundMs: s.roundMs,
    demandHalfLifeMs: s.demandHalfLifeMs,
    damping: s.damping,
    maxStep: s.maxStep,
    hysteresis: s.hysteresis,
    confirmMs: s.confirmMs,
    unmetFraction: s.unmetFraction,
  });
  if (!parsed.success) throw new SimConfigError(`rebalance settings: ${issues(parsed.error)}`);
  return parsed.data;
}

/** Lease settings of a run; throws SimConfigError. */
export function leaseSettings(s: Settings): LeaseSettings {
  const parsed = LeaseSettings.safeParse({
    leaseMs: s.leaseMs,
    graceMs: s.graceMs,
    skewMs: s.skewMs,
    reportIntervalMs: s.reportIntervalMs,
    maxOverridesPerPolicy: s.maxOverrides,
  });
  if (!parsed.success) throw new SimConfigError(`lease settings: ${issues(parsed.error)}`);
  return parsed.data;
}

/** Borrowing settings of a run (undefined when off), the planner's parsed by its schema; throws SimConfigError. */
export function borrowingSettings(s: Settings): SimBorrowingOptions | undefined {
  if (s.borrowing === 'off') return undefined;
  const parsed = BorrowPlannerSettings.safeParse({
    ...DEFAULT_BORROW_PLANNER,
    maxLenders: s.borrowMaxLenders,
    unreachableBackoffMs: s.borrowBackoffMs,
  });
  if (!parsed.success) throw new SimConfigError(`borrowing settings: ${issues(parsed.error)}`);
  return {
    planner: parsed.data,
    lowWater: s.borrowLowWater,
    deadlineMs: s.forwardTimeoutMs,
    reserveMs: borrowReserveMs(s.storeTimeoutMs),
  };
}

/** Every region's floor must fit in the budget, or the rebalancer has nothing to follow demand with. */
export function checkFloor(
  s: Settings,
  regions: readonly string[],
  policy: Policy,
  rebalance: RebalanceSettings,
): void {
  const floor = shareFloor(policy.capacity, policy.maxCost, policy.minShare, rebalance);
  if (floor * regions.length > 1)
    throw new SimConfigError(
      `the share floor (${floor}: minShare ${s.minShare}, or maxCost/capacity) × ${regions.length} regions exceeds the budget`,
    );
}

/** All the checks of the `dynamic` strategy (the conservation protocol). */
export function validateProtocol(s: Settings, regions: readonly string[], policy: Policy): void {
  const rebalance = rebalanceSettings(s);
  const lease = leaseSettings(s);
  // The engine's own rule (core/lease/lease-coordinator.ts): an agent that does not acknowledge a shrink must
  // lapse before a lapsed peer may settle at its safe share.
  if (lease.graceMs <= lease.leaseMs + 2 * lease.skewMs + rebalance.roundMs)
    throw new SimConfigError(
      `graceMs (${lease.graceMs}) must exceed leaseMs + 2 × skewMs + roundMs (${lease.leaseMs + 2 * lease.skewMs + rebalance.roundMs})`,
    );
  checkFloor(s, regions, policy, rebalance);
  borrowingSettings(s);
}

/** The checks of `naive-dynamic` (the rebalancer alone). */
export function validateRebalancer(s: Settings, regions: readonly string[], policy: Policy): void {
  checkFloor(s, regions, policy, rebalanceSettings(s));
}
