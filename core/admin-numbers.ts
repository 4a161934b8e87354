/**
 * How the admin API and the CLI print the numbers operators read: shares and the absolute amounts they give,
 * rounded to a fixed, documented precision so no float noise (`0.020000000000000004`) reaches a reader.
 * Enforcement never uses these: agents size buckets from the exact shares.
 */

/** Decimal places of a share in admin answers: 0.0001 is a hundredth of a percent of the budget. */
export const SHARE_DECIMALS = 4;
/** Decimal places of absolute capacities (tokens) and rates (tokens per second) in admin answers. */
export const AMOUNT_DECIMALS = 3;
/**
 * Significant digits of a rate below 1 that the system derived rather than an operator wrote (a sliding log's
 * capacity / windowSeconds): 5 events per 10 minutes shows as 0.00833, and a slow rate never as 0.
 */
export const DERIVED_RATE_DIGITS = 3;

/** `value` rounded half away from zero to `decimals` places, as the shortest decimal that prints it. */
export function roundTo(value: number, decimals: number): number {
  if (!Number.isFinite(value)) return value;
  const scale = 10 ** decimals;
  const rounded = Math.sign(value) * Math.round(Math.abs(value) * scale);
  // Dividing an integer by a power of ten gives the double nearest the decimal, which prints without noise.
  return rounded / scale + 0;
}

/**
 * `value` rounded down to `decimals` places, exactly: the largest decimal of that many places whose number is
 * not above `value`. (`n / scale`, two integers, is the number nearest the decimal n·10^-decimals, so it is
 * what the answer prints and what a reader parses; the product `value * scale` alone can round up across an
 * integer, so the candidate is corrected both ways.) The number 0.3 shows as 0.3; 0.29999999999999993, below
 * it, as 0.2999 at 4 places.
 */
export function floorTo(value: number, decimals: number): number {
  if (!Number.isFinite(value)) return value;
  const scale = 10 ** decimals;
  let n = Math.floor(value * scale);
  while (n / scale > value) n--;
  while ((n + 1) / scale <= value) n++;
  return n / scale + 0;
}

/**
 * A share as admin answers show it: rounded down, so the shares shown never sum above what is in force (a sum
 * of shares rounded to nearest could show 1.0002 for three shares of a third).
 */
export function roundShare(share: number): number {
  return floorTo(share, SHARE_DECIMALS);
}

/** An absolute capacity or refill a share gives, rounded down: never more than a region enforces. */
export function floorAmount(amount: number): number {
  return floorTo(amount, AMOUNT_DECIMALS);
}

/** A capacity or a rate as admin answers show it. */
export function roundAmount(amount: number): number {
  return roundTo(amount, AMOUNT_DECIMALS);
}

/**
 * A rate derived by division, as admin answers show it: AMOUNT_DECIMALS places from 1 up, DERIVED_RATE_DIGITS
 * significant digits below (rounded to nearest either way).
 */
export function roundDerivedRate(rate: number): number {
  if (!Number.isFinite(rate) || rate === 0) return rate;
  if (Math.abs(rate) >= 1) return roundAmount(rate);
  return Number(rate.toPrecision(DERIVED_RATE_DIGITS)) + 0;
}

/** Every share of a region → share map, rounded. */
export function roundShares(shares: Readonly<Record<string, number>>): Record<string, number> {
  return Object.fromEntries(Object.entries(shares).map(([region, s]) => [region, roundShare(s)]));
}
