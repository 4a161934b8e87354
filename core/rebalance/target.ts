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
 * Demand below which a policy has none to follow, cost per second: NEGLIGIBLE_DEMAND of one subject's rate
 * (the policy's refill). A policy's demand sums its subjects', so it is below this only when even a single
 * subject would be using less than 2% of its own budget.
 */
export function negligibleDemand(refillPerSecond: number): number {
  return refillPerSecond * NEGLIGIBLE_DEMAND;
}

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
 * covers `damping` of the distance but moves no region by more than `maxStep`, lands on the ideal when within half
 * the settle band, and never lets a region fall below the floor or the sum exceed 1.
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
    const damped =
      Math.abs(gap) * (1 - settings.damping) < settings.settleBand / 2 ? gap : gap * settings.damping;
    const step = Math.max(-settings.maxStep, Math.min(settings.maxStep, damped));
    out[i] = Math.max(floor, current[i]! + step);
    sum += out[i]!;
  }
  // Grows capped at maxStep can take more than the capped shrinks free: grow less rather than shrink more, so no
  // region shrinks by more than maxStep in one step.
  let grown = 0;
  for (let i = 0; i < out.length; i++) grown += Math.max(0, out[i]! - current[i]!);
  if (sum > 1 && grown > 0) {
    const keep = Math.max(0, 1 - (sum - 1) / grown);
    sum = 0;
    for (let i = 0; i < out.length; i++) {
      if (out[i]! > current[i]!) out[i] = current[i]! + (out[i]! - current[i]!) * keep;
      sum += out[i]!;
    }
  }
  if (sum > 1) fitBudget(out, floor, sum);
  // Capped shrinks can free more than the capped grows take (two regions shrink by maxStep, one grows): the
  // growers take it all, so every step hands out the whole budget. A step that left part of it unallocated
  // would keep it so for as long as the move is cut short (demand that stops mid-move leaves no target).
  else fillToward(out, ideal);
  return out;
}

/** Shares that sum to less than this are short of the budget (beyond float noise). */
export const WHOLE = 1 - 1e-9;

/**
 * Hand what `shares` leave of the budget to the regions below `ideal`, in proportion to their distance from it
 * and never past it (a grow frees nothing: the conservation rules issue it into the room the claims leave).
 * What the ideal leaves over (it sums to 1, but a region held at its share in cool-down may keep part) goes to
 * the regions in proportion to their shares. Only regions `eligible` (all by default) take any. In place.
 */
export function fillToward(
  shares: number[],
  ideal: readonly number[] | undefined,
  eligible: readonly boolean[] = shares.map(() => true),
): void {
  let sum = 0;
  for (const s of shares) sum += s;
  let left = 1 - sum;
  if (!(left > 1 - WHOLE)) return;
  if (ideal !== undefined) {
    let gap = 0;
    for (let i = 0; i < shares.length; i++) if (eligible[i]) gap += Math.max(0, ideal[i]! - shares[i]!);
    if (gap > 0) {
      const part = Math.min(1, left / gap);
      for (let i = 0; i < shares.length; i++) {
        if (!eligible[i]) continue;
        const add = Math.max(0, ideal[i]! - shares[i]!) * part;
        shares[i] = shares[i]! + add;
        left -= add;
      }
    }
  }
  if (!(left > 1 - WHOLE)) return;
  let total = 0;
  let count = 0;
  for (let i = 0; i < shares.length; i++) {
    if (!eligible[i]) continue;
    total += shares[i]!;
    count++;
  }
  if (count === 0) return;
  for (let i = 0; i < shares.length; i++) {
    if (eligible[i]) shares[i] = shares[i]! + (total > 0 ? (left * shares[i]!) / total : left / count);
  }
}

/**
 * Shares that sum to less than 1 with no step due made whole: the rest of the budget goes to the regions below
 * `ideal` (when there is one), then to the regions in proportion to their shares; regions in their regrowth
 * cool-down take none while another region can. Undefined when the shares are whole already. Budget left
 * unallocated helps nobody, and nothing else would hand it out before demand moved the shares again (a lapse
 * the coordinator restored the budget around, or a record of an earlier incarnation).
 */
export function wholeShares(
  state: RebalanceState,
  ideal: readonly number[] | undefined,
  cooldown?: Cooldown,
): ShareVector | undefined {
  let sum = 0;
  for (const s of state.shares) sum += s;
  if (sum >= WHOLE) return undefined;
  const out = [...state.shares];
  const free = out.map(
    (_, r) =>
      cooldown === undefined ||
      state.shrunkAt?.[r] === undefined ||
      cooldown.now - state.shrunkAt[r] >= cooldown.ms,
  );
  fillToward(out, ideal, free.some(Boolean) ? free : undefined);
  return out;
}

/**
 * Shares with every region below `floor` lifted to it (a floor raised by a policy change: a larger `maxCost` or
 * `minShare`), the room taken from the regions above it in proportion to what they hold above it. Undefined when
 * no region is below the floor or the floors do not fit in the budget.
 */
export function liftToFloor(shares: readonly number[], floor: number): ShareVector | undefined {
  if (floor * shares.length > 1 || !shares.some((s) => s < floor - 1e-9)) return undefined;
  const out = shares.map((s) => Math.max(s, floor));
  let sum = 0;
  for (const s of out) sum += s;
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
  /** Since when (ms) the target has been beyond the hysteresis band with room needed, while at rest. */
  beyondSince?: number | undefined;
  /** When (ms) each region's share last shrank, for the regrowth cool-down. */
  shrunkAt?: (number | undefined)[] | undefined;
}

/**
 * A region whose share shrank does not grow again for `ms` (the policy's idle TTL plus the clock-skew margins):
 * then, between any two writes of a bucket (never further apart than its TTL), a region's refill only rises and
 * then falls, so `min(rate at the last write, rate now)` never exceeds what was in force and the rate-history
 * floor (core/lease/agent-lease.ts) stays inert. A dip followed by a rise within the TTL would leave the floor to
 * refill every bucket written before the dip at the lowest rate of the window, which with shares that move all
 * the time (demand following the sun) withholds much of the budget. Borrowing covers a region in cool-down.
 */
export interface Cooldown {
  now: number;
  ms: number;
}

/** What a round knows of each region's demand for one policy (cost per second, smoothed). */
export interface RoundDemand {
  /** What the region's subjects could use under their own limits (core/shares/usage-accounting.ts). */
  demand: readonly number[];
  /** The part of it refused: demand − admitted. */
  unmet: readonly number[];
  /** False for a region not heard from recently: its demand is unknown, not zero, and it keeps its share. */
  known: readonly boolean[];
}

/**
 * The target for `current` given what is known: every region known, shares in proportion to demand
 * (idealShares); some unknown, they keep their shares and the known ones share the rest (idealSharesWithin).
 * None when the known demand is `negligible` (cost per second) or less: smoothed demand of a policy whose traffic
 * stopped decays toward zero keeping its proportions, and a few requests a minute ago are nothing to move the
 * whole budget toward (see `negligibleDemand`).
 */
export function targetShares(
  current: readonly number[],
  d: RoundDemand,
  floor: number,
  negligible = 0,
): ShareVector | undefined {
  let known = 0;
  for (let i = 0; i < d.demand.length; i++) if (d.known[i]) known += d.demand[i]!;
  if (!(known > negligible)) return undefined;
  if (d.known.every(Boolean)) return idealShares(d.demand, floor);
  return idealSharesWithin(d.demand, d.known, current, floor);
}

/**
 * True when some region the target would grow is short of room: its unmet demand is at least `unmetFraction`
 * of its demand. A move where every grower is already served would only shrink others and destroy their
 * stored burst for nothing.
 */
export function roomNeeded(
  current: readonly number[],
  ideal: readonly number[],
  d: RoundDemand,
  settings: RebalanceSettings,
): boolean {
  if (settings.unmetFraction === 0) return true;
  for (let i = 0; i < current.length; i++) {
    if (!(ideal[i]! > current[i]!) || !d.known[i]) continue;
    if (d.unmet[i]! > 0 && d.unmet[i]! >= settings.unmetFraction * d.demand[i]!) return true;
  }
  return false;
}

/**
 * One round of the rebalancer for one unit: the next shares toward `ideal`, or undefined when no step is due.
 * Updates `state.moving` and `state.lastIdeal`: a rebalance under way keeps going while its target still moves
 * (smoothed demand still decaying toward a new level), so it ends where the target comes to rest, not at the
 * first point within the settle band.
 *
 * With `gate` (the policy's default vector), a rebalance at rest starts only when room is needed (roomNeeded)
 * and the target has stayed beyond the hysteresis band for `confirmMs`; once started it is not gated.
 */
export function rebalanceRound(
  state: RebalanceState,
  ideal: ShareVector | undefined,
  floor: number,
  settings: RebalanceSettings,
  gate?: { now: number; demand: RoundDemand },
  cooldown?: Cooldown,
): ShareVector | undefined {
  if (cooldown !== undefined && ideal !== undefined) ideal = coolDown(state, ideal, floor, cooldown);
  if (!state.moving && gate !== undefined && ideal !== undefined) {
    const beyond =
      stepToward(state.shares, ideal, floor, settings, false) !== undefined &&
      roomNeeded(state.shares, ideal, gate.demand, settings);
    if (!beyond) state.beyondSince = undefined;
    else state.beyondSince ??= gate.now;
    if (state.beyondSince === undefined || gate.now - state.beyondSince < settings.confirmMs) {
      state.lastIdeal = ideal;
      return undefined;
    }
  }
  state.beyondSince = undefined;
  const next = stepToward(state.shares, ideal, floor, settings, state.moving);
  state.moving = next !== undefined || (state.moving && targetMoving(ideal, state.lastIdeal, settings));
  state.lastIdeal = ideal;
  if (next !== undefined && cooldown !== undefined) {
    const shrunkAt = (state.shrunkAt ??= []);
    next.forEach((share, r) => {
      if (share < state.shares[r]!) shrunkAt[r] = cooldown.now;
    });
  }
  return next;
}

/**
 * The target with every region in cool-down held at its current share; what they would have taken goes to the
 * regions free to grow, in proportion to their targets (borrowing moves a subject's tokens wherever they
 * accrue), and stays unallocated only when every region is held.
 */
function coolDown(
  state: RebalanceState,
  ideal: readonly number[],
  floor: number,
  cooldown: Cooldown,
): ShareVector {
  const out = [...ideal];
  let freed = 0;
  let free = 0;
  const held: boolean[] = out.map(() => false);
  for (let r = 0; r < out.length; r++) {
    const at = state.shrunkAt?.[r];
    if (at !== undefined && cooldown.now - at < cooldown.ms && out[r]! > state.shares[r]!) {
      const kept = Math.max(floor, state.shares[r]!);
      freed += out[r]! - kept;
      out[r] = kept;
      held[r] = true;
    } else free += out[r]!;
  }
  if (freed > 0 && free > 0) {
    for (let r = 0; r < out.length; r++) if (!held[r]) out[r] = out[r]! + (freed * out[r]!) / free;
  }
  return out;
}

/** Equal split: the safe static share of each of `n` regions. */
export function equalShares(n: number): ShareVector {
  return Array.from({ length: n }, () => 1 / n);
}
