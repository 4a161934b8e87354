/**
 * What a policy kind is, declared in one place: every capability the rest of the code asks a kind about
 * (borrowing, sharding, classes, grants, reservations, leases, failure modes), the store group and Lua scripts
 * that decide it, the refusal reasons only it answers and its defaults (`KindTraits`, pure data), and, in
 * `Kind`, what it plugs in: its fragment of the policy schema (the fields and rules only it has), its reference
 * model and its share-sizing function.
 *
 * Adding a kind: a folder core/kinds/<kind>/ (its `traits.ts`, its `schema.ts` and an `index.ts` putting them
 * together with its model and sizing, whose signature is its store group's, `GroupSizing`), its name in
 * `KIND_NAMES` below, and one line in core/kinds/index.ts's `KINDS`, typed over every kind name: a kind left out,
 * missing a trait, or with a sizing its store group cannot call, does not compile.
 * test/unit/core/kinds/kind-registry.test.ts checks each declared trait against what the code does.
 */
import type { z } from 'zod';
import type { DayCheck } from '../models/daily-budget.js';
import type { LogCheck } from '../models/sliding-log.js';
import type { FailureMode, PolicyMode } from '../policy/policy.js';
import type { RegionalShare } from '../shares/shares.js';
import type { DecisionReason } from '../wire/agent.js';
import type { BucketCheck } from '../wire/bucket.js';

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
  /**
   * The limit it promises on one subject's admissions (the conservation checker, test/helpers/conservation-cases.ts
   * `promiseViolations`, holds every kind to its own): `burst` admitted(W) ≤ capacity + rate × W over any span W;
   * `rolling` ≤ capacity within any span shorter than its window; `calendarDay` ≤ capacity per calendar day;
   * `alignedWindow` ≤ capacity per window of its window field aligned to multiples of it since the Unix epoch.
   */
  readonly promise: 'burst' | 'rolling' | 'calendarDay' | 'alignedWindow';
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
  /** An admitted check carries a lease token, and `DELETE /v1/leases/{lease}` gives its units back. */
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
  /** A policy of the kind, as validation messages name it ("a sliding log counts whole events"). */
  readonly called: string;
  /** What one unit of a cost is, plural, as validation messages name it ("… counts whole events"). */
  readonly units: string;
  /** The Lua scripts (lua/<name>.lua) that decide and refund it. */
  readonly scripts: readonly LuaScriptName[];
  /** Refusal reasons of a decision that only some kinds answer (the rest are common to every kind). */
  readonly refusalReasons: readonly DecisionReason[];
  /** Per-kind defaults: the time zone a policy counts in, the shortest idle TTL of its keys. */
  readonly defaults: {
    readonly timeZone: string | undefined;
    readonly minIdleTtlSeconds: number | undefined;
  };
}

/**
 * What a kind's rules read of a policy being parsed: the fields every kind has (core/policy/policy.ts), before
 * its defaults are filled. A kind's rules see its own fields besides (`KindSchema.fields`).
 */
export interface PolicyDraft {
  readonly kind: KindName;
  readonly capacity: number;
  readonly refillPerSecond?: number | undefined;
  readonly maxCost?: number | undefined;
  readonly mode: PolicyMode;
  readonly onStoreFailure: FailureMode;
  readonly idleTtlSeconds?: number | undefined;
  readonly minShare?: number | undefined;
  readonly classes?:
    | Readonly<Record<string, { readonly capacity: number; readonly maxCost?: number | undefined }>>
    | undefined;
}

/** What a kind's rules may ask of the registry (core/kinds/index.ts), which its schema cannot import. */
export interface KindLookup {
  /** The traits of `kind`. */
  kindOf(kind: KindName): KindTraits;
  /** The kinds whose trait `trait` is true, by name. */
  kindsWith(trait: (k: KindTraits) => boolean): KindName[];
}

/** A kind's fragment of the policy schema (core/kinds/<kind>/schema.ts), composed by core/policy/policy.ts. */
export interface KindSchema {
  /**
   * The policy fields only this kind has (zod, each optional): part of every policy's schema, so a policy of
   * another kind that sets one is refused by `rules`, never as an unknown field.
   */
  readonly fields: z.ZodRawShape;
  /**
   * The rules of those fields, run on every policy (of this kind or another) once its rate is known to be
   * well formed (core/policy/policy.ts `checkPolicy`), in registry order: a problem is an issue on `ctx`.
   * `p` holds the policy's fields, this kind's among them.
   */
  rules?(p: PolicyDraft, ctx: z.RefinementCtx, kinds: KindLookup): void;
}

/**
 * What a sizing function may read of a policy: the filled fields of core/policy/policy.ts `Policy` it sizes from
 * (written out, not picked from `Policy`, whose type is composed from the registry: the registry's own type may
 * not depend on it). A kind whose sizing reads another field of the policy adds it here.
 */
export interface SizedPolicyFields {
  readonly capacity: number;
  readonly refillPerSecond: number;
  readonly idleTtlSeconds: number;
  readonly windowSeconds?: number | undefined;
  readonly leaseSeconds?: number | undefined;
  readonly timeZone?: string | undefined;
}

/**
 * How a region's share of a policy becomes what a store group's script enforces, one signature per group (the
 * agent's router, regional-agent/decisions/check-router.ts, calls the checked kind's own): the policy as the
 * subject's class sees it, the key the group keeps it under, the cost, the share, and, for the `day` group, the
 * agent's clock (epoch ms), around which the window boundaries the script chooses from are computed.
 */
export interface GroupSizing {
  readonly store: (policy: SizedPolicyFields, key: string, cost: number, share: RegionalShare) => BucketCheck;
  readonly log: (policy: SizedPolicyFields, key: string, cost: number, share: RegionalShare) => LogCheck;
  readonly day: (
    policy: SizedPolicyFields,
    key: string,
    cost: number,
    share: RegionalShare,
    nowMs: number,
  ) => DayCheck;
}

/** What a kind plugs in besides its traits. */
interface KindParts {
  readonly schema: KindSchema;
  /** The in-memory model of its scripts (clock injected), the Lua's reference in the case tables. */
  readonly model: abstract new (...args: never[]) => unknown;
}

/**
 * A kind as registered: its traits, its schema fragment, its model and its sizing function, typed by the store
 * group that decides it (`decidedBy`), so the router can call it: a kind on an existing group brings its sizing
 * in its own folder.
 */
export type Kind<K extends KindName = KindName> = KindTraits<K> &
  KindParts &
  {
    [G in KindTraits['decidedBy']]: {
      readonly decidedBy: G;
      /** How a region's share of the budget becomes what it enforces (the agent and the simulator call it). */
      readonly sizing: GroupSizing[G];
    };
  }[KindTraits['decidedBy']];
