/**
 * The shapes the decision path passes between its steps: a check once it is validated and routed, a request
 * made of such checks, and the outcome before it is put on the wire (each check's own way through the steps is
 * check.ts).
 */
import type { CheckResult, DegradedCause } from '../../core/wire/agent.js';
import type { BucketCheck } from '../../core/wire/bucket.js';
import type { Policy } from '../../core/policy/policy.js';
import type { DayCheck } from '../../core/models/daily-budget.js';
import type { LogCheck } from '../../core/models/sliding-log.js';
import type { Check } from './check.js';

interface CheckBase {
  /** The policy as this subject sees it: its class's capacity, refill and maxCost when it has one. */
  policy: Policy;
  /** The subject's class, when it has one (named by the check or by the policy's `subjects`). */
  subjectClass?: string | undefined;
  /** Normalized (or hashed) subject. */
  subject: string;
  cost: number;
  /** The sliding log of a `log` check; undefined on every other route. */
  log?: LogCheck | undefined;
  /** The daily counter of a `day` check; undefined on every other route. */
  day?: DayCheck | undefined;
}

/** Decided by this region's bucket store, against `bucket` (sized from this region's share). */
export interface StoreCheck extends CheckBase {
  route: 'store';
  bucket: BucketCheck;
  homeRegion: undefined;
  cause: undefined;
}

/** A sliding-log policy decided by this region's store, against `log` (its limit sized from the share). */
export interface LogStoreCheck extends CheckBase {
  route: 'log';
  bucket: undefined;
  log: LogCheck;
  homeRegion: undefined;
  cause: undefined;
}

/** A daily policy decided by this region's store, against `day` (its limit sized from the share). */
export interface DayStoreCheck extends CheckBase {
  route: 'day';
  bucket: undefined;
  day: DayCheck;
  homeRegion: undefined;
  cause: undefined;
}

/** A strict policy homed in another region: decided there. */
export interface ForwardCheck extends CheckBase {
  route: 'forward';
  bucket: undefined;
  homeRegion: string;
  cause: undefined;
}

/** Nothing can decide it (no lease, no way to the home region): the policy's failure mode applies now. */
export interface FailCheck extends CheckBase {
  route: 'fail';
  bucket: undefined;
  homeRegion: undefined;
  cause: DegradedCause;
}

/**
 * One check, validated and routed. Every variant has the same fields (unused ones undefined): this object is
 * built for every check of every request, and one shape keeps the code that reads it monomorphic.
 */
export type PreparedCheck = StoreCheck | LogStoreCheck | DayStoreCheck | ForwardCheck | FailCheck;

/** A request the service accepted. */
export interface PreparedRequest {
  checks: PreparedCheck[];
  idempotencyKey: string | undefined;
  dryRun: boolean;
  /** Decided here for another region (strict mode's home), which answers the caller and remembers a refusal. */
  forwarded?: boolean | undefined;
  /**
   * A reservation's decision (docs/reservations.md): its admission tops nothing up from other regions, since the
   * refund of what it does not use would find the bucket refilled by the loan, and drop it (tokens lost).
   */
  reservation?: boolean | undefined;
}

/** The subject's budget behind a borrowing check (core/wire/rate-limit-headers.ts). */
export type { GlobalBudget } from '../../core/wire/rate-limit-headers.js';

/** The decision, before it is put on the wire. */
export interface DecisionOutcome {
  allowed: boolean;
  retryAfterMs: number | null;
  /**
   * Every check of the request, in its order, as routed and as decided: its result, whether it fit (a check that
   * did not is why the request was denied), its window, its global budget when it borrows, and what it charged.
   */
  checks: Check[];
  /** Every check's result, in the request's order (`checks[i].result`): the list the answer puts on the wire. */
  results: CheckResult[];
  replayed: boolean;
  /** True when the denial comes only from fail-closed failures (store, home region, lease), not from quota. */
  unavailable: boolean;
}
