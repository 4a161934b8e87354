import type { RebalanceSettings } from './settings.js';

/** Shares by region index (regions are ordered once per coordinator; arrays keep the hot loop cheap). */
export type ShareVector = number[];

/**
 * The floor of one region's share for a policy: `minShare` (or the default), and never below what lets the
 * region admit the policy's largest cost.
 */
export function shareFloor(
  capacity: number,
  maxCost: number,
  minShare: number | undefined,
  settings: RebalanceSettings,
): number {
  return Math.max(minShare ?? settings.defaultMinShare, maxCost / capacity);
}

/**
 * A region whose demand is below this fraction of the total counts as having none: smoothed demand that stopped
 * decays toward zero without reaching it, and without the cut the target would creep down for minutes.
 */
export const NEGLIGIBLE_DEMAND = 0.02;

/**
 * Shares that follow demand: each region gets its floor, and the rest of the budget in proportion to its demand
 * (negligible demand counting as none). Returns undefined when there is no demand at all (nothing to follow) or
 * the floors do not fit in the budget.
 */
export function idealShares(demand: readonly number[], floor: number): ShareVector | undefined {
  const n = demand.length;
  if (floor * n > 1) return undefined;
  let total = 0;
  for (const d of demand) total += d;
  if (!(total > 0)) return undefined;
  let counted = 0;
  for (const d of demand) if (d >= total * NEGLIGIBLE_DEMAND) counted += d;
  const spare = 1 - floor * n;
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    const d = demand[i]! >= total * NEGLIGIBLE_DEMAND ? demand[i]! : 0;
    out[i] = floor + (spare * d) / counted;
  }
  return out;
}

/**
 * The next step from `current` toward the ideal, or undefined when no step is due: no demand, or every region
 * close enough to its ideal. "Close enough" is the hysteresis band while shares are at rest (so noise does not
 * move them) and the narrower settle band while a rebalance is under way (so it finishes the job). The step
 * covers `damping` of the distance, lands on the ideal when within half the settle band, and never lets a
 * region fall below the floor or the sum exceed 1.
 */
export function nextShares(
  current: readonly number[],
  demand: readonly number[],
  floor: number,
  settings: RebalanceSettings,
  moving = false,
): ShareVector | undefined {
  return stepToward(current, idealShares(demand, floor), floor, settings, moving);
}

/**
 * Ideal shares when demand is known for some regions only (a subject named in some regions' bounded reports of
 * constrained subjects, not in others): the regions without data keep `base` (the policy's shares), and the
 * regions with data share the rest, each its floor plus a part in proportion to its demand. Undefined when no
 * region has data or the floors do not fit in what is left.
 */
export function idealSharesWithin(
  demand: readonly number[],
  known: readonly boolean[],
  base: readonly number[],
  floor: number,
): ShareVector | undefined {
  const n = demand.length;
  let left = 1;
  let counted = 0;
  let total = 0;
  for (let i = 0; i < n; i++) {
    if (known[i]) {
      counted++;
      total += demand[i]!;
    } else {
      left -= base[i]!;
    }
  }
  if (counted === 0 || !(total > 0) || floor * counted > left) return undefined;
  const spare = left - floor * counted;
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    out[i] = known[i] ? floor + (spare * demand[i]!) / total : base[i]!;
  }
  return out;
}

/** One damped step from `current` toward `ideal` (see nextShares), or undefined when none is due. */
export function stepToward(
  current: readonly number[],
  ideal: readonly number[] | undefined,
  floor: number,
  settings: RebalanceSettings,
  moving = false,
): ShareVector | undefined {
  if (ideal === undefined) return undefined;
  let far = 0;
  for (let i = 0; i < current.length; i++) far = Math.max(far, Math.abs(ideal[i]! - current[i]!));
  if (far < (moving ? settings.settleBand : settings.hysteresis)) return undefined;
  const out = new Array<number>(current.length);
  let sum = 0;
  for (let i = 0; i < current.length; i++) {
    const gap = ideal[i]! - current[i]!;
    // Within half the settle band a region lands on its ideal, so steps do not shrink forever.
    const step =
      Math.abs(gap) * (1 - settings.damping) < settings.settleBand / 2 ? gap : gap * settings.damping;
    out[i] = Math.max(floor, current[i]! + step);
    sum += out[i]!;
  }
  if (sum > 1) fitBudget(out, floor, sum);
  return out;
}

/**
 * Steps of different sizes per region (snapping) can sum a little above 1: take the excess from the regions
 * above the floor, in proportion to what they hold above it, so no floor is broken.
 */
function fitBudget(shares: number[], floor: number, sum: number): void {
  const excess = sum - 1;
  let above = 0;
  for (const s of shares) above += s - floor;
  for (let i = 0; i < shares.length; i++) {
    shares[i] = shares[i]! - (excess * (shares[i]! - floor)) / above;
  }
  // The subtraction itself can leave an ulp; trim it from the largest.
  let total = 0;
  let largest = 0;
  for (let i = 0; i < shares.length; i++) {
    total += shares[i]!;
    if (shares[i]! > shares[largest]!) largest = i;
  }
  if (total > 1) shares[largest] = shares[largest]! - (total - 1);
}

/**
 * True while the target itself is still moving (by at least a quarter of the settle band per round), as it
 * does while smoothed demand decays toward a new level after a shift.
 */
export function targetMoving(
  ideal: readonly number[] | undefined,
  previous: readonly number[] | undefined,
  settings: RebalanceSettings,
): boolean {
  if (ideal === undefined || previous === undefined || ideal.length !== previous.length) return false;
  let moved = 0;
  for (let i = 0; i < ideal.length; i++) moved = Math.max(moved, Math.abs(ideal[i]! - previous[i]!));
  return moved >= settings.settleBand / 4;
}

/** What one allocation unit carries from round to round for the rebalancer. */
export interface RebalanceState {
  shares: readonly number[];
  /** A rebalance is under way (hysteresis has two thresholds). */
  moving: boolean;
  /** The target of the last round, to tell whether it is still moving. */
  lastIdeal?: number[] | undefined;
}

/**
 * One round of the rebalancer for one unit: the next shares toward `ideal`, or undefined when no step is due.
 * Updates `state.moving` and `state.lastIdeal`: a rebalance under way keeps going while its target still moves
 * (smoothed demand still decaying toward a new level), so it ends where the target comes to rest, not at the
 * first point within the settle band.
 */
export function rebalanceRound(
  state: RebalanceState,
  ideal: ShareVector | undefined,
  floor: number,
  settings: RebalanceSettings,
): ShareVector | undefined {
  const next = stepToward(state.shares, ideal, floor, settings, state.moving);
  state.moving = next !== undefined || (state.moving && targetMoving(ideal, state.lastIdeal, settings));
  state.lastIdeal = ideal;
  return next;
}

/** Equal split: the safe static share of each of `n` regions. */
export function equalShares(n: number): ShareVector {
  return Array.from({ length: n }, () => 1 / n);
}
