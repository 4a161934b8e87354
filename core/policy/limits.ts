/**
 * The bounds and number rules every part of the policy schema shares: core/policy/policy.ts (the fields every
 * kind has) and each kind's fragment (core/kinds/<kind>/schema.ts). A leaf that imports neither, so the models
 * and wire schemas a kind registers (core/kinds/<kind>/index.ts) can read these bounds without a cycle through
 * the schema that composes them. core/policy/policy.ts re-exports each.
 */
import { z } from 'zod';

/** Largest capacity and refill a policy may declare: keeps micro-token arithmetic exact in doubles (≤ 2^53). */
export const MAX_CAPACITY = 1e9;
export const MAX_REFILL_PER_SECOND = 1e9;
/**
 * Smallest capacity and maxCost an operator may write (coordinator admin API, docs/coordinator.md): a thousandth
 * of a token, 1,000 micro-tokens. Below one micro-token (the unit every store counts in) a policy could never
 * admit anything, and close to it a region's share loses most of its budget to rounding down. Kinds counted in
 * whole units (sliding_log, concurrency) need whole capacities ≥ 1 already. Enforced at write time only, so a
 * policy stored before keeps being read.
 */
export const MIN_WRITTEN_CAPACITY = 0.001;
/** Smallest refill an operator may write: one micro-token a second (`lua/token_bucket.lua` counts µ-tokens/µs). */
export const MIN_WRITTEN_REFILL_PER_SECOND = 1e-6;
/** Idle TTL ceiling: 30 days. */
export const MAX_IDLE_TTL_SECONDS = 30 * 24 * 3600;

/**
 * Largest limit of a kind counted in whole units (a sliding log, a concurrency policy): entries per subject per
 * region are bounded by it.
 */
export const MAX_LOG_LIMIT = 100_000;

/** Seconds of a (nominal) day: a daily budget's rate is capacity / this. */
export const SECONDS_PER_DAY = 86_400;

/** A number > 0, ≤ `max` and finite, its messages naming `what`. */
export const positiveFinite = (max: number, what: string) =>
  z
    .number()
    .positive(`${what} must be > 0`)
    .max(max, `${what} must be ≤ ${max}`)
    .refine(Number.isFinite, `${what} must be finite`);
