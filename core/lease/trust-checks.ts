/**
 * What an agent checks before it believes the coordinator. NATS permissions already keep anyone but the
 * coordinator from writing allocation records or answering heartbeats; these checks are the second line, for a
 * record or a reply that is well-formed yet impossible (a leaked coordinator credential, a bug, a replayed or
 * hand-edited record). A refused record leaves the agent on the last record it accepted; a refused renewal is no
 * renewal (the lease runs out on its own). Both are counted and logged by the shell.
 */
import type { AllocationRecord, Renewal, UnitRecord } from '../wire/protocol.js';
import { settingRange } from '../config/setting-range.js';
import { ownValue } from '../own-keys.js';
import { defaultLeaseSettings, LeaseSettings } from './settings.js';
import { shareSum, sumExceedsBudget } from './shares-in-force.js';

export { SHARE_SUM_TOLERANCE } from './shares-in-force.js';

/** Limits on what a renewal may ask of an agent. */
export interface RenewalBounds {
  /** Longest lease an agent accepts, ms. */
  maxLeaseMs: number;
  /** Longest grace period an agent accepts, ms. */
  maxGraceMs: number;
  /** Shortest and longest report interval an agent follows, ms. */
  minReportIntervalMs: number;
  maxReportIntervalMs: number;
}

/**
 * Defaults: ten times the coordinator's default lease (6 s) and grace (12 s); report intervals within what the
 * coordinator's own settings allow and at most a third of the longest lease (the coordinator needs three
 * heartbeats per lease to know an agent holds one).
 */
export const defaultRenewalBounds: RenewalBounds = {
  maxLeaseMs: 10 * defaultLeaseSettings.leaseMs,
  maxGraceMs: 10 * defaultLeaseSettings.graceMs,
  minReportIntervalMs: settingRange(LeaseSettings.shape.reportIntervalMs).min,
  maxReportIntervalMs: Math.floor((10 * defaultLeaseSettings.leaseMs) / 3),
};

/** The most one unit's agents may be deciding with: per region the larger of its share and its pending one. */
function unitClaim(unit: UnitRecord): number {
  let sum = 0;
  const regions = new Set([...Object.keys(unit.shares), ...Object.keys(unit.pending)]);
  for (const r of regions) sum += Math.max(ownValue(unit.shares, r) ?? 0, ownValue(unit.pending, r) ?? 0);
  return sum;
}

const shown = (s: number): string => String(Math.round(s * 1e6) / 1e6);

/**
 * Why `record` cannot be a coordinator's record, or undefined when it may be: the safe shares, the default
 * vector and every override must each sum to at most 1 (a shrinking region counted at its pending share, as
 * its agents may still be deciding with it until they acknowledge).
 */
export function allocationProblem(record: AllocationRecord): string | undefined {
  const safe = shareSum(Object.values(record.safe));
  if (sumExceedsBudget(safe)) return `safe shares sum to ${shown(safe)} > 1`;
  const base = unitClaim(record.default);
  if (sumExceedsBudget(base)) return `shares in force sum to ${shown(base)} > 1`;
  for (const unit of Object.values(record.overrides)) {
    const claim = unitClaim(unit);
    if (sumExceedsBudget(claim)) return `an override's shares in force sum to ${shown(claim)} > 1`;
  }
  return undefined;
}

/** Why `reply` asks more than `bounds` allow, or undefined when it is within them. */
export function renewalProblem(reply: Renewal, bounds: RenewalBounds): string | undefined {
  if (reply.leaseMs > bounds.maxLeaseMs) {
    return `lease of ${reply.leaseMs} ms is longer than the ${bounds.maxLeaseMs} ms allowed`;
  }
  if (reply.graceMs > bounds.maxGraceMs) {
    return `grace of ${reply.graceMs} ms is longer than the ${bounds.maxGraceMs} ms allowed`;
  }
  if (reply.graceMs <= reply.leaseMs) return `grace of ${reply.graceMs} ms is not longer than the lease`;
  if (
    reply.reportIntervalMs < bounds.minReportIntervalMs ||
    reply.reportIntervalMs > bounds.maxReportIntervalMs
  ) {
    return `report interval of ${reply.reportIntervalMs} ms is outside [${bounds.minReportIntervalMs}, ${bounds.maxReportIntervalMs}] ms`;
  }
  return undefined;
}
