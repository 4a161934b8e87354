/**
 * What a policy kind is, declared in one place: every capability the rest of the code asks a kind about
 * (borrowing, sharding, classes, grants, reservations, leases, failure modes), the store group and Lua scripts
 * that decide it, its reference model and share-sizing function (by name: core/kinds/bindings.ts holds the
 * imports, checked against these names), the refusal reasons only it answers, and its defaults. Pure data with
 * no import of the policy schema, so core/policy/policy.ts can read it.
 *
 * Adding a kind: a module next to this one declaring a `KindTraits` (every field is required), its entry in
 * core/kinds/index.ts and core/kinds/bindings.ts (both typed over every kind name, so a kind left out fails to
 * compile), and test/unit/core/kinds/kind-registry.test.ts checks each declared trait against what the code does.
 */
import type { DecisionReason } from '../wire/agent.js';

/** The policy kinds, in the order the admin API lists them (core/policy/policy.ts PolicyKind). */
export const KIND_NAMES = ['token_bucket', 'sliding_log', 'concurrency', 'daily'] as const;
export type KindName = (typeof KIND_NAMES)[number];

/** A Lua script of `lua/` by file name, without `.lua`. */
export type LuaScriptName =
  | 'token_bucket'
  | 'refund'
  | 'lend'
  | 'credit'
  | 'grant'
  | 'subject_creation'
  | 'sliding_log'
  | 'sliding_log_refund'
  | 'daily_budget'
  | 'daily_budget_refund';

export interface KindTraits<K extends KindName = KindName> {
  readonly kind: K;
  /**
   * The store group that decides a check of the kind in the agent (regional-agent/decisions/): `store` the
   * token-bucket store (`lua/token_bucket.lua`), `log` the sliding-log store, `day` the daily counters.
   */
  readonly decidedBy: 'store' | 'log' | 'day';
  /** Where its rate comes from: `refillPerSecond` as written, capacity / its window, or capacity / one day. */
  readonly rate: 'declared' | 'window' | 'day';
  /** The field holding its window (the rate's divisor and the entries' lifetime), if it has one. */
  readonly window: 'windowSeconds' | 'leaseSeconds' | undefined;
  /** True when it counts whole units: a cost, capacity or maxCost that is not an integer is refused. */
  readonly wholeUnits: boolean;
  /** A regional bucket short of tokens may borrow them from other regions (and lend its own). */
  readonly borrows: boolean;
  /** `shards` may split a hot key into sub-buckets. */
  readonly shards: boolean;
  /** `newSubjects` may cap how many new subjects a region creates per minute. */
  readonly newSubjects: boolean;
  /** `classes` and `subjects` may give subjects limits of their own. */
  readonly classes: boolean;
  /** `POST /v1/grants` may hand a client a local allowance of a subject's tokens. */
  readonly grants: boolean;
  /** `POST /v1/reservations` may hold an amount until it is committed or cancelled. */
  readonly reservations: boolean;
  /** An admitted check carries a lease token, and `POST /v1/leases/release` gives its units back. */
  readonly leases: boolean;
  /** A decision may be a dry run (`dryRun: true`: nothing charged). */
  readonly dryRun: boolean;
  /** A decision may carry an `idempotencyKey` (replayed, not charged twice). */
  readonly idempotency: boolean;
  /** `mode: strict` (one home region decides for all) is allowed. */
  readonly strictMode: boolean;
  /** `onStoreFailure: local` (an in-process emergency token bucket) is allowed. */
  readonly emergencyBucket: boolean;
  /** What the kind counts, as validation messages name it ("an emergency token bucket is not …"). */
  readonly noun: string;
  /** The Lua scripts (lua/<name>.lua) that decide and refund it. */
  readonly scripts: readonly LuaScriptName[];
  /** The export of core/ that models its scripts (in-memory, clock injected). */
  readonly model: 'BucketModel' | 'SlidingLogModel' | 'DailyBudgetModel';
  /** The export of core/ that sizes what a region enforces from its share of the budget. */
  readonly sizing: 'sizedBucket' | 'sizedLog' | 'sizedDay';
  /** Refusal reasons of a decision that only some kinds answer (the rest are common to every kind). */
  readonly refusalReasons: readonly DecisionReason[];
  /** Per-kind defaults: the time zone a policy counts in, the shortest idle TTL of its keys. */
  readonly defaults: {
    readonly timeZone: string | undefined;
    readonly minIdleTtlSeconds: number | undefined;
  };
}
