/**
 * The conservation property suite's cases (docs/design.md "Conservation property suite", CONTRIBUTING.md): a
 * generated case is a set of policies over the feature space and a script of steps across three regions (traffic,
 * share moves, agent restarts, store freezes, NATS cuts, clock jumps). One driver runs a case on the models
 * (test/helpers/model-world.ts, unit tier) and another on the real stack (integration tier); both hand what was
 * admitted to `conservationViolations`, the global checker.
 *
 * A new feature is not done until `arbitraryCase` generates it and the checker knows its bound.
 */
import fc from 'fast-check';
import type { CheckResult } from '../../core/wire/agent.js';
import { KIND_NAMES, kindOf, type KindName, type KindTraits } from '../../core/kinds/index.js';
import { ANONYMOUS_SUBJECT } from '../../core/models/subject-creation.js';
import { parsePolicy, SECONDS_PER_DAY, withClass, type Policy } from '../../core/policy/policy.js';

export const REGIONS = ['us', 'eu', 'ap'] as const;
export type Region = (typeof REGIONS)[number];

/** One policy of a case, as generated; `policyOf` makes the stored policy (`PUT /v1/policies/{name}` body). */
export interface PolicySpec {
  name: string;
  kind: KindName;
  capacity: number;
  /** Token buckets: refill per second. */
  refillPerSecond?: number | undefined;
  /** sliding_log: window; concurrency: lease; seconds. */
  windowSeconds?: number | undefined;
  shards?: number | undefined;
  /** A class `gold` of `goldFactor` × the limits, named for subject `named-gold`; subject `g` asks for it. */
  goldFactor?: number | undefined;
  mode: 'regional' | 'strict' | 'local';
  homeRegion?: Region | undefined;
  onStoreFailure: 'closed' | 'open' | 'local';
  newSubjects?: { perMinute: number; flood: 'deny' | 'shared' } | undefined;
  maxCost: number;
}

export interface Check {
  policy: string;
  subject: string;
  /** A class the caller names (a hostile one, e.g. `constructor`, must be refused with a 4xx). */
  class?: string | undefined;
  cost: number;
}

export interface Call {
  /** Sent from each of these regions. */
  regions: Region[];
  checks: Check[];
  idempotencyKey?: string | undefined;
  dryRun: boolean;
  /** Sent this many times at once from each region (a burst that drains buckets and races borrows). */
  repeat: number;
  /**
   * Sent through the region's direct client (`AgentClient` with `direct`, docs/agent.md "Direct decisions"),
   * which decides it on the region's Redis under a term where it can (a single check with no class, dry run or
   * key) and asks the agent otherwise. Drawn only in term cases (`arbitraryCase(…, { terms: true })`); the models
   * decide it as any other call (a direct decision is the agent's script on the agent's bucket).
   */
  direct?: boolean | undefined;
}

export type Step =
  /** The calls, all at once; again `rounds` times, `gapMs` apart. */
  | { op: 'traffic'; calls: Call[]; rounds: number; gapMs: number }
  | { op: 'advance'; ms: number }
  | { op: 'move'; policy: string; from: Region; to: Region; amount: number }
  /** Reserve `amount` of one check, then commit `used` of it, cancel it, or hold it (left to expire). */
  | {
      op: 'reserve';
      region: Region;
      policy: string;
      subject: string;
      amount: number;
      settle: 'commit' | 'cancel' | 'hold';
      used: number;
    }
  /**
   * A client takes a local grant of `amount` tokens (`POST /v1/grants`), spends `spend` of them in its own
   * process (each an admission of cost 1), then hands the rest back or crashes (the rest is lost), or cheats:
   * hands the rest back, then the whole grant again under the same id, and the whole grant under a forged id
   * (both must credit nothing: a return is bound to its take).
   */
  | {
      op: 'grant';
      region: Region;
      policy: string;
      subject: string;
      amount: number;
      spend: number;
      settle: 'return' | 'crash' | 'cheat';
    }
  /** The calls of each region sent as one `POST /v1/decisions/batch` per region (independent decisions). */
  | { op: 'batch'; calls: Call[] }
  /**
   * The region's agent stops and a new one starts. `crash` (term cases): it vanishes without a goodbye and
   * without waiting for its terms to run out (a process killed), and its successor takes its instance name, while
   * clients keep deciding under its last terms; `lean` first, as a lapse's: bursts of these calls until the
   * rebalancer moved the region's share, so the crash comes while a shrink of it may still be unacknowledged.
   */
  | { op: 'restart'; region: Region; crash?: boolean | undefined; lean?: Call[] | undefined }
  | { op: 'freeze'; region: Region; on: boolean }
  | { op: 'cut'; region: Region; on: boolean }
  /**
   * `region`'s lease lapses past its grace period: its agents' heartbeats no longer reach the coordinator (loans,
   * records and decisions still flow), so they decide and lend at the region's safe share. Once they do, the
   * calls (bursts from the other regions, which drain their buckets and borrow from it) run `rounds` times,
   * `gapMs` apart, while the coordinator moves the others' shares as it sees fit (the share epoch may move
   * during the lapse). `stallAfterMs`: that long into the first round NATS stalls for longer than a borrower
   * waits, so grants already lent arrive after their borrow stopped waiting (late grants). `heal`: renewals come
   * back at the end of the step; otherwise the region stays lapsed until it restarts or the case ends. `lean`:
   * before the lapse, bursts of this call (from the lapsing region, or from the others) until the rebalancer
   * moved the lapsing region's share off its safe share, so that the coordinator answers the lapse with a move
   * (it shrinks a share above the safe one to it, or the others to make room for the safe share).
   */
  | {
      op: 'lapse';
      region: Region;
      lean?: Call | undefined;
      calls: Call[];
      rounds: number;
      gapMs: number;
      stallAfterMs?: number | undefined;
      heal: boolean;
    };

export interface Case {
  policies: PolicySpec[];
  borrowing: boolean;
  steps: Step[];
  /**
   * Term cases: direct clients of `region` decide `p0`'s subject `a` throughout the case (a steady flow under
   * the agent's terms, across every step), beside the calls marked `direct`.
   */
  terms?: { region: Region } | undefined;
}

/** The body of the stored policy (what an operator PUTs), without its name. */
export function policyBody(s: PolicySpec): Record<string, unknown> {
  const body: Record<string, unknown> = {
    kind: s.kind,
    capacity: s.capacity,
    mode: s.mode,
    onStoreFailure: s.onStoreFailure,
    maxCost: s.maxCost,
  };
  const { rate, window } = kindOf(s.kind);
  if (rate === 'declared') body['refillPerSecond'] = s.refillPerSecond;
  if (window !== undefined) body[window] = s.windowSeconds;
  if (s.shards !== undefined) body['shards'] = s.shards;
  if (s.mode === 'strict') body['homeRegion'] = s.homeRegion;
  if (s.newSubjects !== undefined) body['newSubjects'] = s.newSubjects;
  if (s.goldFactor !== undefined) {
    const gold: Record<string, number> = { capacity: s.capacity * s.goldFactor, maxCost: s.maxCost };
    if (rate === 'declared') gold['refillPerSecond'] = s.refillPerSecond! * s.goldFactor;
    body['classes'] = { gold };
    body['subjects'] = { 'named-gold': 'gold' };
  }
  return body;
}

const parsedPolicies = new WeakMap<PolicySpec, Policy>();

/**
 * The policy a spec stands for, parsed once per spec object: the runs and the checker ask for it per case, per
 * answer and per window, and the schema's parse took a twentieth of the property suite's time.
 */
export function policyOf(s: PolicySpec): Policy {
  let policy = parsedPolicies.get(s);
  if (policy === undefined) {
    policy = parsePolicy({ name: s.name, ...policyBody(s) });
    parsedPolicies.set(s, policy);
  }
  return policy;
}

const region = fc.constantFrom(...REGIONS);

/** `arb` in one case of `oneIn`, else undefined. */
function sometimes<T>(arb: fc.Arbitrary<T>, oneIn: number): fc.Arbitrary<T | undefined> {
  return fc.oneof({ weight: oneIn - 1, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: arb });
}

const policySpec = (name: string): fc.Arbitrary<PolicySpec> =>
  fc
    .record({
      // Every registered kind (token buckets twice as often): a new kind is generated without being named here.
      kind: fc.constantFrom<KindName>('token_bucket', ...KIND_NAMES),
      capacity: fc.integer({ min: 2, max: 24 }),
      refillPerSecond: fc.constantFrom(0.1, 0.5, 2, 5),
      windowSeconds: fc.integer({ min: 1, max: 20 }),
      shards: sometimes(fc.integer({ min: 2, max: 4 }), 2),
      goldFactor: sometimes(fc.constantFrom(2, 3), 3),
      mode: fc.constantFrom('regional', 'regional', 'regional', 'strict', 'local'),
      homeRegion: region,
      onStoreFailure: fc.constantFrom('closed', 'open', 'local'),
      newSubjects: sometimes(
        fc.record({ perMinute: fc.integer({ min: 1, max: 3 }), flood: fc.constantFrom('deny', 'shared') }),
        4,
      ),
      maxCost: fc.constantFrom(1, 1, 2),
    })
    .map((r): PolicySpec => {
      const k = kindOf(r.kind);
      const shards =
        k.shards && r.newSubjects === undefined && r.shards !== undefined && r.capacity >= r.shards
          ? r.shards
          : undefined;
      // The policy rules (core/kinds/): only token buckets fail `local`, strict never fails open, concurrency is
      // never strict.
      const mode = !k.strictMode && r.mode === 'strict' ? 'regional' : r.mode;
      let onStoreFailure = r.onStoreFailure;
      if (onStoreFailure === 'local' && !k.emergencyBucket) onStoreFailure = 'closed';
      if (onStoreFailure === 'open' && mode === 'strict') onStoreFailure = 'closed';
      return {
        name,
        kind: r.kind,
        capacity: r.capacity,
        refillPerSecond: k.rate === 'declared' ? r.refillPerSecond : undefined,
        windowSeconds: k.window !== undefined ? r.windowSeconds : undefined,
        shards,
        goldFactor: r.goldFactor,
        mode,
        homeRegion: mode === 'strict' ? r.homeRegion : undefined,
        onStoreFailure,
        newSubjects: k.newSubjects && shards === undefined ? r.newSubjects : undefined,
        // Every sub-bucket must hold maxCost.
        maxCost: r.maxCost <= r.capacity / (shards ?? 1) ? r.maxCost : 1,
      };
    });

const SUBJECTS = ['a', 'b', 'c', 'g', 'named-gold'] as const;

function callOf(names: readonly string[]): fc.Arbitrary<Call> {
  const check = fc.record({
    policy: fc.constantFrom(...names),
    subject: fc.oneof(
      { weight: 3, arbitrary: fc.constant('a') },
      { weight: 2, arbitrary: fc.constantFrom(...SUBJECTS) },
    ),
    hostileClass: sometimes(fc.constantFrom('constructor', '__proto__', 'toString', 'platinum'), 15),
    cost: fc.constantFrom(1, 1, 1, 2),
  });
  return fc
    .record({
      regions: fc.uniqueArray(region, { minLength: 1, maxLength: 3 }),
      checks: fc.uniqueArray(check, { minLength: 1, maxLength: 2, selector: (c) => c.policy }),
      idempotencyKey: sometimes(fc.constantFrom('k1', 'k2', 'k3'), 4),
      dryRun: fc.oneof(
        { weight: 5, arbitrary: fc.constant(false) },
        { weight: 1, arbitrary: fc.constant(true) },
      ),
      repeat: fc.oneof(
        { weight: 3, arbitrary: fc.constant(1) },
        { weight: 2, arbitrary: fc.integer({ min: 2, max: 12 }) },
      ),
    })
    .map((r) => ({
      regions: r.regions,
      checks: r.checks.map((c) => ({
        policy: c.policy,
        subject: c.subject,
        class: c.hostileClass ?? (c.subject === 'g' ? 'gold' : undefined),
        cost: c.cost,
      })),
      idempotencyKey: r.idempotencyKey,
      dryRun: r.dryRun,
      repeat: r.repeat,
    }));
}

function stepOf(names: readonly string[]): fc.Arbitrary<Step> {
  return fc.oneof(
    {
      weight: 10,
      arbitrary: fc
        .record({
          calls: fc.array(callOf(names), { minLength: 1, maxLength: 3 }),
          rounds: fc.oneof(
            { weight: 1, arbitrary: fc.constant(1) },
            { weight: 1, arbitrary: fc.integer({ min: 2, max: 6 }) },
          ),
          gapMs: fc.constantFrom(0, 100, 500, 1000),
        })
        .map((t) => ({ op: 'traffic' as const, ...t })),
    },
    {
      weight: 5,
      arbitrary: fc
        .oneof(fc.integer({ min: 0, max: 3000 }), fc.constantFrom(30_000, 3_600_000, 12 * 3_600_000))
        .map((ms) => ({ op: 'advance' as const, ms })),
    },
    {
      weight: 2,
      arbitrary: fc
        .record({
          policy: fc.constantFrom(...names),
          from: region,
          to: region,
          amount: fc.constantFrom(0.05, 0.1, 0.2, 1 / 3),
        })
        .map((m) => ({ op: 'move' as const, ...m })),
    },
    {
      weight: 2,
      arbitrary: fc
        .record({
          region,
          policy: fc.constantFrom(...names),
          subject: fc.constantFrom('a', 'b'),
          amount: fc.constantFrom(1, 2),
          settle: fc.constantFrom('commit', 'cancel', 'hold'),
          used: fc.constantFrom(0, 1, 2),
        })
        .map((r) => ({ op: 'reserve' as const, ...r, used: Math.min(r.used, r.amount) })),
    },
    {
      weight: 2,
      arbitrary: fc
        .record({
          region,
          policy: fc.constantFrom(...names),
          subject: fc.constantFrom('a', 'a', 'b'),
          amount: fc.integer({ min: 1, max: 4 }),
          spend: fc.integer({ min: 0, max: 4 }),
          settle: fc.constantFrom('return', 'crash', 'cheat'),
        })
        .map((g) => ({ op: 'grant' as const, ...g })),
    },
    {
      weight: 2,
      arbitrary: fc
        .array(callOf(names), { minLength: 1, maxLength: 4 })
        .map((calls) => ({ op: 'batch' as const, calls })),
    },
    { weight: 1, arbitrary: region.map((r) => ({ op: 'restart' as const, region: r })) },
    {
      weight: 1,
      arbitrary: fc.record({ region, on: fc.boolean() }).map((f) => ({ op: 'freeze' as const, ...f })),
    },
    {
      weight: 1,
      arbitrary: fc.record({ region, on: fc.boolean() }).map((f) => ({ op: 'cut' as const, ...f })),
    },
    { weight: 1, arbitrary: lapseOf(names) },
  );
}

type LapseStep = Extract<Step, { op: 'lapse' }>;

/**
 * A lapse step: calls sent only from the other regions, in bursts of 3 or more (the lapsed region lends). The
 * first is one plain check of `p0`'s subject `a` from both other regions, in bursts of 6 to 12: above what a
 * region's share of the largest generated capacity holds, so a borrowing policy borrows.
 */
function lapseOf(names: readonly string[], at?: Region): fc.Arbitrary<LapseStep> {
  return fc
    .record({
      region: at === undefined ? region : fc.constant(at),
      burst: fc.integer({ min: 6, max: 12 }),
      calls: fc.array(callOf(names), { maxLength: 1 }),
      rounds: fc.integer({ min: 1, max: 4 }),
      gapMs: fc.constantFrom(0, 100, 300),
      stallAfterMs: sometimes(fc.constantFrom(5, 20, 50), 3),
      heal: fc.boolean(),
      lean: fc.constantFrom(undefined, 'toward', 'away'),
    })
    .map(({ burst, calls, lean, ...l }): LapseStep => {
      const others = REGIONS.filter((r) => r !== l.region);
      const plain = (regions: Region[], repeat: number) => plainCall(names[0]!, regions, repeat);
      return {
        op: 'lapse',
        ...l,
        lean: lean === undefined ? undefined : plain(lean === 'toward' ? [l.region] : others, 6),
        calls: [
          plain(others, burst),
          ...calls.map((c) => {
            const regions = c.regions.filter((r) => r !== l.region);
            return { ...c, regions: regions.length > 0 ? regions : others, repeat: Math.max(c.repeat, 3) };
          }),
        ],
      };
    });
}

/** One plain check of `policy`'s subject `a`, cost 1, from `regions`, `repeat` at once from each. */
function plainCall(policy: string, regions: Region[], repeat: number): Call {
  return { regions, checks: [{ policy, subject: 'a', cost: 1 }], dryRun: false, repeat };
}

/** The kinds that borrow (and lend): a lapse case's first policy is one of them, in `regional` mode. */
const BORROWING_KINDS = KIND_NAMES.filter((k) => kindOf(k).borrows);

/**
 * A generated case: 1-2 policies over every feature, borrowing on or off, and up to `maxSteps` steps. `lapse`:
 * one of the steps (at a drawn place among them) is a lease lapse past the grace period, whatever else is drawn,
 * and the first policy is a regional one of a kind that borrows, unsharded and without a subject-creation cap
 * (so that the other regions borrow from the lapsed one; the other policy and steps are drawn as ever).
 */
export function arbitraryCase(
  maxSteps = 10,
  options: { lapse?: boolean; terms?: boolean } = {},
): fc.Arbitrary<Case> {
  if (options.terms === true) return termCase(maxSteps);
  return fc
    .record({
      count: fc.integer({ min: 1, max: 2 }),
      borrowing: fc.boolean(),
    })
    .chain(({ count, borrowing }) => {
      const names = ['p0', 'p1', 'p2'].slice(0, count);
      const drawn = fc.array(stepOf(names), { minLength: 1, maxLength: maxSteps });
      const steps =
        options.lapse === true
          ? fc
              .tuple(fc.array(stepOf(names), { maxLength: maxSteps - 1 }), lapseOf(names), fc.nat())
              .map(([rest, lapse, at]) => rest.toSpliced(at % (rest.length + 1), 0, lapse))
          : drawn;
      const policies = fc.tuple(...names.map((n) => policySpec(n)));
      return fc.record({
        policies:
          options.lapse === true
            ? fc
                .tuple(policies, fc.constantFrom(...BORROWING_KINDS))
                .map(([[first, ...rest], kind]) => [lapseLender(first!, kind), ...rest])
            : policies,
        borrowing: fc.constant(borrowing),
        steps,
      });
    });
}

/**
 * A term case: a region `R` whose direct clients decide `p0` (a regional token bucket that gives terms:
 * unsharded, no subject-creation cap, 60-126 tokens, 5 tokens a second) throughout the case, and among up to `maxSteps` - 2 drawn steps (their
 * calls marked `direct` two times in three) at drawn places: a lapse of `R` past its grace (its lean drawn as
 * ever) and a crash of `R`'s agent after a lean away from it (a shrink of `R`'s share, which its terms hold
 * unacknowledged), its successor under the same instance name. Terms are out while `R`'s share shrinks, while its
 * lease lapses and across the restart.
 */
function termCase(maxSteps: number): fc.Arbitrary<Case> {
  return fc
    .record({ count: fc.integer({ min: 1, max: 2 }), borrowing: fc.boolean(), at: region })
    .chain(({ count, borrowing, at }) => {
      const names = ['p0', 'p1'].slice(0, count);
      const others = REGIONS.filter((r) => r !== at);
      const direct = (call: Call): fc.Arbitrary<Call> =>
        fc.constantFrom(true, true, false).map((d) => ({ ...call, direct: d }));
      const marked = (step: Step): fc.Arbitrary<Step> =>
        step.op === 'traffic' || step.op === 'batch'
          ? fc.tuple(...step.calls.map(direct)).map((calls) => ({ ...step, calls }))
          : step.op === 'lapse'
            ? fc.tuple(...step.calls.map(direct)).map((calls) => ({ ...step, calls }))
            : fc.constant(step);
      const rest = fc
        .array(stepOf(names), { maxLength: Math.max(0, maxSteps - 2) })
        .chain((list) => fc.tuple(...list.map(marked)).map((done): Step[] => [...done]));
      // A region's demand counts each subject's refusals only within the subject's own rate, and every region's
      // flow of `a` reaches that: the lean away from `R` asks for several subjects, so the others' demand is
      // several times `R`'s.
      const lean = ['a', 'b', 'c', 'd'].map((subject) => ({
        ...plainCall('p0', others, 6),
        checks: [{ policy: 'p0', subject, cost: 1 }],
      }));
      const crash: Step = { op: 'restart', region: at, crash: true, lean };
      const steps = fc
        .tuple(rest, lapseOf(names, at).chain(marked), fc.nat(), fc.nat())
        .map(([list, lapse, i, j]) => {
          const withLapse = list.toSpliced(i % (list.length + 1), 0, lapse);
          return withLapse.toSpliced(j % (withLapse.length + 1), 0, crash);
        });
      return fc.record({
        policies: fc
          .tuple(...names.map((n) => policySpec(n)))
          // The largest generated rate: demand moves shares only within a subject's rate, and the region's flow
          // (a few checks a second) must stay below the others' leans for a lean away from it to shrink it.
          // And a bucket whose regional shares are large enough for a direct client to take tokens ahead (at
          // most a tenth of a share, from a share at least half full: 60 tokens, a third each, give 2).
          .map(([first, ...more]) => [
            {
              ...lapseLender(first!, 'token_bucket'),
              refillPerSecond: 5,
              capacity: 60 + 3 * (first!.capacity - 2),
            },
            ...more,
          ]),
        borrowing: fc.constant(borrowing),
        steps,
        terms: fc.constant({ region: at }),
      });
    });
}

/** `spec` as a regional policy of borrowing kind `kind`, unsharded and uncapped, its other draws kept valid. */
function lapseLender(spec: PolicySpec, kind: KindName): PolicySpec {
  const k = kindOf(kind);
  return {
    ...spec,
    kind,
    mode: 'regional',
    homeRegion: undefined,
    shards: undefined,
    newSubjects: undefined,
    refillPerSecond: k.rate === 'declared' ? (spec.refillPerSecond ?? 0.5) : undefined,
    windowSeconds: k.window !== undefined ? (spec.windowSeconds ?? 10) : undefined,
    onStoreFailure: spec.onStoreFailure === 'local' && !k.emergencyBucket ? 'closed' : spec.onStoreFailure,
  };
}

/** One admitted (or refunded) charge a run saw, at the time its answer came (epoch ms). */
export interface Charge {
  policy: string;
  /** The bucket's subject: the caller's, or the policy's shared bucket (`#anonymous`). */
  subject: string;
  class: string | undefined;
  /** The region whose agent answered. */
  region: Region;
  /** When the answer came (epoch ms); `sentAt`: when the call was sent (the real stack; the models: `at`). */
  at: number;
  sentAt: number;
  cost: number;
}

/** What a run collects: the charges admitted by quota, and what else must not have happened. */
export interface RunRecord {
  charges: Charge[];
  /** Problems seen while running (a hostile class admitted, a failure-mode admission while nothing failed, …). */
  problems: string[];
  /**
   * Idempotent admissions already counted, by (key, body, region whose store charged, check), with when: a
   * retry of the same body in another region replays the checks recorded where they were charged (a strict
   * check at its home) and charges the others there, so an answer can be part replay, part charge.
   */
  counted: Map<string, number>;
  /**
   * Keyed answers replayed whole: the `counted` keys of their checks, one of which must be counted by the end of
   * the run (a replay repeats an admission of this very request; calls of one step may be answered in any order).
   */
  replays: { keys: string[]; body: string }[];
  /**
   * The `counted` keys of keyed calls whose answer was lost (see `lost` on `recordAnswer`'s answer): the store may
   * have admitted and recorded them all the same, so a replay of one is no admission without a charge.
   */
  lost: Set<string>;
}

export function newRecord(): RunRecord {
  return { charges: [], problems: [], counted: new Map(), replays: [], lost: new Set() };
}

/**
 * Replays of a request never admitted (see `RunRecord.replays`): each an admission without a charge. A request is
 * admitted when an answer said so, or possibly when its answer was lost; a refusal, a conflict or a bad request
 * admitted nothing.
 */
export function unadmittedReplays(record: RunRecord): string[] {
  return record.replays
    .filter((r) => !r.keys.some((k) => record.counted.has(k) || record.lost.has(k)))
    .map((r) => `a replay of a request never admitted: ${r.body}`);
}

/** Degraded causes under which the store or the home region may have decided (and recorded) after all. */
const LOST_CAUSES = new Set(['store_unavailable', 'home_unreachable']);

/**
 * Whether an HTTP answer of `POST /v1/decisions` may hide the store's own answer: a 5xx (the agent or its store
 * gave up; a script that was sent may still have run, as a frozen Redis runs what it holds once thawed), or a
 * check decided by its failure mode because its store or home region did not answer in time.
 */
export function answerLost(status: number, body: { results?: { cause?: string }[] }): boolean {
  return status >= 500 || (body.results ?? []).some((r) => r.cause !== undefined && LOST_CAUSES.has(r.cause));
}

const FAILURE_REASONS = new Set(['fail_open', 'emergency_bucket']);

/**
 * Record one call's answer: an admitted, charged (not a dry run, not a replay) answer adds one charge per check.
 * `failing`: whether a store freeze or a NATS cut was in force (a failure-mode admission is then the policy's
 * choice, outside the bound, and only then).
 */
export function recordAnswer(
  record: RunRecord,
  policies: ReadonlyMap<string, PolicySpec>,
  call: Call,
  answer:
    | {
        allowed: boolean;
        replayed?: boolean | undefined;
        results: Pick<CheckResult, 'reason' | 'allowed'>[];
        /** The store's or home region's own answer may be lost (`answerLost`). */
        lost?: boolean;
      }
    | { error: string; lost?: boolean },
  at: number,
  failing: boolean,
  region: Region,
  sentAt = at,
): void {
  const hostile = call.checks.find((c) => c.class !== undefined && c.class !== 'gold');
  const noGold = call.checks.find(
    (c) => c.class === 'gold' && policies.get(c.policy)?.goldFactor === undefined,
  );
  // Where a keyed call's check i is counted: once per record (key, call body and the region holding the record).
  const countKey = (i: number): string => {
    const spec = policies.get(call.checks[i]!.policy)!;
    const where = spec.mode === 'strict' ? spec.homeRegion : region;
    return `${call.idempotencyKey}\u0000${bodyText(call)}\u0000${where}\u0000${i}`;
  };
  // A keyed call whose answer was lost may have been admitted and recorded where its checks are kept.
  const refused = hostile !== undefined || noGold !== undefined;
  if (answer.lost === true && call.idempotencyKey !== undefined && !call.dryRun && !refused)
    call.checks.forEach((_, i) => record.lost.add(countKey(i)));
  if ('error' in answer) return;
  if (refused) {
    record.problems.push(
      `a check of class ${(hostile ?? noGold)!.class} was answered, not refused: ${JSON.stringify(answer)}`,
    );
    return;
  }
  if (!answer.allowed || call.dryRun) return;
  if (answer.replayed === true) {
    // A replay repeats an admission of this very request: one never admitted was admitted without a charge.
    if (call.idempotencyKey !== undefined)
      record.replays.push({
        keys: call.checks.map((_, i) => countKey(i)),
        body: bodyText(call),
      });
    return;
  }
  call.checks.forEach((c, i) => {
    const r = answer.results[i];
    if (r === undefined) {
      record.problems.push(`no result for check ${i}`);
      return;
    }
    if (r.reason !== undefined && FAILURE_REASONS.has(r.reason)) {
      if (!failing)
        record.problems.push(`${c.policy} admitted by its failure mode (${r.reason}) while nothing failed`);
      return;
    }
    const spec = policies.get(c.policy)!;
    if (call.idempotencyKey !== undefined) {
      // Counted once while its record may live (1 h, and never longer than the policy's idle TTL).
      const key = countKey(i);
      const ttlMs = Math.min(3_600_000, policyOf(spec).idleTtlSeconds * 1000);
      const before = record.counted.get(key);
      if (before !== undefined && at - before < ttlMs) return;
      record.counted.set(key, at);
    }
    const shared = r.reason === 'shared_bucket';
    const cls = shared
      ? undefined
      : (c.class ?? (c.subject === 'named-gold' && spec.goldFactor !== undefined ? 'gold' : undefined));
    record.charges.push({
      policy: c.policy,
      subject: shared ? ANONYMOUS_SUBJECT : c.subject,
      class: cls,
      region,
      at,
      sentAt,
      cost: c.cost,
    });
  });
}

const EPS = 1e-6;

/** What a kind promises of one subject's admissions (core/kinds/kind.ts `KindTraits.promise`). */
export type KindPromise = KindTraits['promise'];

/** The limits a promise is held to: the policy's (or the subject's class's) capacity and rate, and its window. */
export interface PromisedBound {
  capacity: number;
  refillPerSecond: number;
  /** The window field's value, seconds (`rolling`, `alignedWindow`). */
  windowSeconds: number | undefined;
}

/**
 * The admissions of one subject (`list`, sorted by `at`) that break `promise`, as messages naming `what`:
 * `burst` admitted(W) ≤ C + R·W over every span W, `rolling` ≤ C within any span shorter than the window,
 * `calendarDay` ≤ C per UTC day (the generator's daily policies count in UTC), `alignedWindow` ≤ C per window
 * aligned to multiples of the window since the Unix epoch. Each counts only what it is sure of: an answer's
 * decision lies between its `sentAt` and its `at`.
 */
export function promiseViolations(
  promise: KindPromise,
  bound: PromisedBound,
  list: readonly Charge[],
  what: string,
): string[] {
  const out: string[] = [];
  const C = bound.capacity;
  if (promise === 'burst') {
    const R = bound.refillPerSecond;
    for (let i = 0; i < list.length; i++) {
      let sum = 0;
      // The widest the window can have been: from the earliest send among them to the last answer.
      let from = list[i]!.sentAt;
      for (let j = i; j < list.length; j++) {
        sum += list[j]!.cost;
        from = Math.min(from, list[j]!.sentAt);
        const w = (list[j]!.at - from) / 1000;
        if (sum > C + R * w + EPS) {
          out.push(`${what}: ${sum} admitted in ${w} s, above C + R·W = ${C} + ${R}·${w}`);
          break;
        }
      }
    }
  } else if (promise === 'calendarDay') {
    const days = new Map<number, number>();
    for (const c of list) {
      const day = Math.floor(c.at / (SECONDS_PER_DAY * 1000));
      days.set(day, (days.get(day) ?? 0) + c.cost);
    }
    for (const [day, sum] of days)
      if (sum > C + EPS) out.push(`${what}: ${sum} admitted on day ${day}, above ${C}`);
  } else if (promise === 'alignedWindow') {
    const windowMs = bound.windowSeconds! * 1000;
    const windows = new Map<number, number>();
    for (const c of list) {
      // Only an answer surely decided in one window: sent and answered within it.
      const window = Math.floor(c.at / windowMs);
      if (Math.floor(c.sentAt / windowMs) !== window) continue;
      windows.set(window, (windows.get(window) ?? 0) + c.cost);
    }
    for (const [window, sum] of windows) {
      if (sum > C + EPS) {
        out.push(
          `${what}: ${sum} admitted in aligned window ${window} of ${bound.windowSeconds} s, above ${C}`,
        );
      }
    }
  } else {
    const windowMs = bound.windowSeconds! * 1000;
    for (let j = 0; j < list.length; j++) {
      let sum = 0;
      // Only admissions surely within one window of each other: the widest span below the window.
      let from = list[j]!.sentAt;
      for (let i = j; i >= 0; i--) {
        from = Math.min(from, list[i]!.sentAt);
        if (list[j]!.at - from >= windowMs) break;
        sum += list[i]!.cost;
      }
      if (sum > C + EPS) out.push(`${what}: ${sum} admitted within ${bound.windowSeconds} s, above ${C}`);
    }
  }
  return out;
}

/**
 * The global checker: for every policy, subject and class, admissions within the bound its kind promises
 * (`KindTraits.promise`, `promiseViolations`; docs/design.md: admitted(W) ≤ C + R·W for a token bucket, ≤ limit
 * in any rolling window for a sliding log, ≤ slots within any lease time for a concurrency policy, ≤ the budget
 * in any calendar day for a daily one), in each region for `local` mode (each region enforces the whole budget).
 * Answers the violations found.
 */
export function conservationViolations(
  policies: readonly PolicySpec[],
  charges: readonly Charge[],
): string[] {
  const out: string[] = [];
  const units = new Map<string, Charge[]>();
  for (const c of charges) {
    // A local policy's regions each enforce the whole budget: its bound holds per region.
    const local = policies.find((p) => p.name === c.policy)?.mode === 'local';
    const key = `${c.policy}\u0000${c.subject}\u0000${c.class ?? ''}${local ? `\u0000${c.region}` : ''}`;
    const list = units.get(key) ?? [];
    list.push(c);
    units.set(key, list);
  }
  for (const [key, list] of units) {
    const first = list[0]!;
    const spec = policies.find((p) => p.name === first.policy)!;
    const policy = withClass(policyOf(spec), first.class);
    list.sort((a, b) => a.at - b.at);
    const what = key.replace(/\u0000/g, '/');
    const bound = {
      capacity: policy.capacity,
      refillPerSecond: policy.refillPerSecond,
      windowSeconds: spec.windowSeconds,
    };
    out.push(...promiseViolations(kindOf(spec.kind).promise, bound, list, what));
  }
  return out.slice(0, 5);
}

/** The decision body of a call, as a caller sends it (single or layered). */
export function callBody(call: Call): Record<string, unknown> {
  const extra: Record<string, unknown> = {};
  if (call.idempotencyKey !== undefined) extra['idempotencyKey'] = call.idempotencyKey;
  if (call.dryRun) extra['dryRun'] = true;
  const check = (c: Check) => ({
    policy: c.policy,
    subject: c.subject,
    cost: c.cost,
    ...(c.class === undefined ? {} : { class: c.class }),
  });
  if (call.checks.length === 1) return { ...check(call.checks[0]!), ...extra };
  return { checks: call.checks.map(check), ...extra };
}

const bodyTexts = new WeakMap<Call, string>();

/** `callBody(call)` as JSON, made once per call: every answer of a keyed call names its body. */
function bodyText(call: Call): string {
  let text = bodyTexts.get(call);
  if (text === undefined) {
    text = JSON.stringify(callBody(call));
    bodyTexts.set(call, text);
  }
  return text;
}

/** A small seeded generator of [0, 1) draws (mulberry32). */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
