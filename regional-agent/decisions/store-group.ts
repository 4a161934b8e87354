/**
 * The token-bucket store group: one slot's checks decided in one `lua/token_bucket.lua` call, with the
 * subject-creation cap's second step and, for regional checks short of this region's tokens, borrowing through
 * its port (borrowing-port.ts).
 */
import type { CheckResult, DecisionReason } from '../../core/wire/agent.js';
import {
  MAX_COST,
  mergeRepeatedBuckets,
  spreadDecision,
  type BucketCheck,
  type Decision,
} from '../../core/wire/bucket.js';
import { HOME_SHED_WORDS } from '../../core/wire/strict.js';
import type { Clock } from '../../core/clock.js';
import { idempotencyRecordKey, idempotencyTtlMs } from '../../core/keys.js';
import { ANONYMOUS_SUBJECT } from '../../core/models/subject-creation.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { StoreGroup } from './check-groups.js';
import { shedError } from '../errors.js';
import { CallerDeadlineError, type DecisionStore } from './decision-store.js';
import type { FailureModes } from './failure-modes.js';
import { newRun, ownBudgetReason, settleRun, type GroupRun } from './group-run.js';
import {
  borrows,
  MAX_COVER_ATTEMPTS,
  MAX_COVER_WAITS,
  type ShortCheck,
  type ShortfallHandler,
} from './borrowing-port.js';
import type { Check } from './check.js';
import type { StoreCheck } from './prepared.js';
import { floodResult, takeCreations, type CreationFlights, type Flooded } from './subject-gate.js';

export interface StoreGroupDeps {
  store: DecisionStore;
  guard: StoreGuard;
  failures: FailureModes;
  metrics: AgentMetrics;
  clock: Clock;
  idempotencyTtlMs: number;
  /** Creations in flight in this agent: racing first decisions of one new subject share one (subject-gate.ts). */
  creations: CreationFlights;
  /** Consulted when a regional check is refused for lack of this region's tokens (see ShortfallHandler). */
  shortfall?: ShortfallHandler | undefined;
}

/** One store group of one request, as the layered runner hands it over. */
export interface StoreGroupCall {
  group: StoreGroup;
  idempotencyKey: string | undefined;
  dryRun: boolean;
  /** Only look (an earlier group denied): report what the buckets hold, charge nothing. */
  lookOnly: boolean;
  deadlineAt: number;
  /**
   * Epoch ms after which this call must charge nothing: the deadline of a region that forwarded the request
   * here and stops waiting then. Unset for a local request.
   */
  chargeBy?: number | undefined;
  /** The record TTL shared by every group of a several-group request (LogGroupCall). */
  recordTtlMs?: number | undefined;
  /** No top-up after an admission (a reservation's: PreparedRequest.reservation). */
  noTopUp?: boolean | undefined;
}

/**
 * Decide one slot's checks in one script call, all-or-nothing, and write each check's result, whether it fit and
 * what it charged. No answer from the store: the policies' failure modes decide. A denial is written as the store
 * gave it: `retryAfterMs > 0` on a check means this region's bucket lacks tokens for it now.
 */
export async function runStoreGroup(deps: StoreGroupDeps, call: StoreGroupCall): Promise<GroupRun> {
  const { group, lookOnly } = call;
  const dryRun = call.dryRun || lookOnly;
  const run = newRun(group);
  const recordKey =
    call.idempotencyKey === undefined
      ? undefined
      : idempotencyRecordKey(group.slotSubject, call.idempotencyKey);
  // Only a charge can be lost to a caller that stopped waiting: a look carries no deadline.
  const chargeBy = dryRun ? undefined : call.chargeBy;
  // A subject-creation cap: the first call decides only buckets that exist (a look only reads, creating nothing).
  const state: GroupCallState = {
    guarded: !lookOnly && group.checks.some((c) => c.prepared.bucket.mustExist === true),
    dryRun,
    recordKey,
    recordTtlMs: call.recordTtlMs,
    chargeBy,
    // Each decision notes the handler's credit generations first, so a refusal knows whether what it saw is stale.
    generations: [],
  };
  let decision: Decision;
  // Why a check still refused for lack of tokens is refused, once a shortfall handler has tried.
  let reasons: Map<number, DecisionReason> | undefined;
  try {
    decision = await decideNoting(deps, group, state);
    if (decision.missing !== undefined) {
      // New subjects: take their creations, then decide again (creating the buckets), or answer the flood.
      const none = await takeCreations(deps, group.checks, decision.missing, dryRun);
      state.guarded = false;
      if (none.length > 0 && none.every((f) => f.answer === 'shared')) {
        // Nothing was decided: the layered runner moves these checks to their policies' shared buckets.
        run.reroute = none.map((f) => group.checks[f.index]!);
        return run;
      }
      if (none.length > 0) {
        // The request is refused; the group's other checks are only looked at, for their numbers.
        const look = await decideGroup(deps, group, state, true);
        const denied = none.filter((f) => f.answer === 'deny');
        return floodGroup(run, group, look, denied);
      }
      decision = await decideNoting(deps, group, state);
    }
    const handler = dryRun ? undefined : deps.shortfall;
    for (let attempt = 0, waits = 0; handler !== undefined && attempt < MAX_COVER_ATTEMPTS;) {
      const short = shortOfTokens(group, decision, state.generations);
      if (short.length === 0) break;
      reasons = new Map(short.map((s) => [s.index, 'share_exhausted']));
      if (deps.clock.now() >= call.deadlineAt) break;
      const outcome = await handler.cover(short, call.deadlineAt);
      short.forEach((s, i) => reasons!.set(s.index, outcome.reasons[i] ?? 'share_exhausted'));
      if (!outcome.covered) break;
      if (outcome.waited === true && waits < MAX_COVER_WAITS) waits++;
      else attempt++;
      decision = await decideNoting(deps, group, state);
    }
  } catch (error) {
    // The forwarding region's deadline passed before the store could run the call: nothing was charged, and
    // the request is shed (the requester hears "busy"), never answered as a store failure.
    if (error instanceof CallerDeadlineError) {
      throw shedError('store_deadline', HOME_SHED_WORDS.store_deadline);
    }
    run.allowed = deps.failures.failAll(group.checks, 'store_unavailable', dryRun);
    return run;
  }
  if (!settleRun(run, decision, { dryRun, lookOnly, recordKey }, deps.metrics)) return run;
  if (!dryRun && decision.allowed && !decision.replayed && call.noTopUp !== true)
    topUp(deps.shortfall, group, decision, state.generations);
  group.checks.forEach((c, j) => {
    const p = c.prepared;
    const b = decision.results[j];
    if (b === undefined) throw new TypeError(`the store answered no result for check ${j}`);
    // A group only looked at (an earlier one denied) reports what it holds, not what it would after paying.
    const remaining =
      lookOnly && decision.allowed ? Math.min(b.remaining + p.cost, p.bucket.capacity) : b.remaining;
    const result: CheckResult = {
      policy: p.policy.name,
      allowed: decision.allowed,
      remaining: remaining > 0 ? remaining : 0,
      limit: p.bucket.capacity,
      resetMs: b.resetMs,
      retryAfterMs: b.retryAfterMs,
      mode: p.policy.mode,
    };
    if (b.retryAfterMs === null) result.reason = 'cost_exceeds_share';
    // Decided on the policy's shared bucket: a new subject past the creation cap (flood answer `shared`). Admitted
    // or refused, that is what the caller must know: the shared bucket's tokens are not the subject's own budget.
    else if (p.subject === ANONYMOUS_SUBJECT) result.reason = 'shared_bucket';
    else if (!decision.allowed && b.retryAfterMs > 0) {
      const reason = reasons?.get(j) ?? unborrowedReason(p, deps.shortfall);
      if (reason !== undefined) result.reason = reason;
    }
    c.result = result;
    c.fits = b.retryAfterMs === 0;
    if (run.charged) {
      c.charge = {
        kind: 'bucket',
        policy: p.policy.name,
        key: p.bucket.key,
        capacity: p.bucket.capacity,
        cost: p.cost,
      };
    }
  });
  return run;
}

/** What the store calls of one group share; `guarded` and `generations` change between its calls. */
interface GroupCallState {
  /** Decide only buckets that exist (the subject-creation cap's first call). */
  guarded: boolean;
  dryRun: boolean;
  recordKey: string | undefined;
  /** The record's TTL when the request fixes it for every group (StoreGroupCall). */
  recordTtlMs: number | undefined;
  chargeBy: number | undefined;
  /** The shortfall handler's credit generations of the group's checks, noted before the last call. */
  generations: (number | undefined)[];
}

// The group's calls are module functions over a state object rather than closures made per group: under tsx,
// every named closure is also given its name with Object.defineProperty each time it is created.

/** One store call for the group, through the guard; `look` only reads (a look carries no deadline). */
function decideGroup(
  deps: StoreGroupDeps,
  group: StoreGroup,
  state: GroupCallState,
  look = false,
): Promise<Decision> {
  const { guarded, recordKey } = state;
  const checks = guarded ? group.checks.map((c) => c.prepared.bucket) : group.checks.map(withoutGuard);
  // Only checks moved to a shared bucket repeat a key (the router refuses a request naming one bucket twice).
  const merged = mergeRepeatedBuckets(checks);
  if (merged?.checks.some((c) => c.cost > MAX_COST) === true)
    return Promise.resolve(neverFits(checks.length));
  const decided = deps.guard.run('decide', () =>
    deps.store.decide(
      {
        checks: merged?.checks ?? checks,
        dryRun: state.dryRun || look,
        idempotency:
          recordKey === undefined
            ? undefined
            : {
                key: recordKey,
                ttlMs:
                  state.recordTtlMs ??
                  idempotencyTtlMs(
                    deps.idempotencyTtlMs,
                    group.checks.map((c) => c.prepared.policy.idleTtlSeconds),
                  ),
              },
      },
      { chargeBy: look ? undefined : state.chargeBy },
    ),
  );
  return merged === undefined ? decided : decided.then((d) => spreadDecision(d, merged.of));
}

/** Checks that cost together more than any bucket holds: refused, none ever fits (`cost_exceeds_share`). */
function neverFits(n: number): Decision {
  const results = Array.from({ length: n }, () => ({
    allowed: false,
    remaining: 0,
    retryAfterMs: null,
    resetMs: null,
  }));
  return { allowed: false, replayed: false, conflict: false, retryAfterMs: null, results };
}

/** A charging (or dry-run) call that first notes the handler's credit generations of the group's checks. */
function decideNoting(deps: StoreGroupDeps, group: StoreGroup, state: GroupCallState): Promise<Decision> {
  const h = state.dryRun ? undefined : deps.shortfall;
  state.generations = group.checks.map((c) => h?.generation?.(c.prepared.policy.name, c.prepared.subject));
  return decideGroup(deps, group, state);
}

/**
 * Why a check is refused for lack of tokens when no shortfall handler tried to cover it: the check's bucket is
 * all that can be known. A bucket holding the subject's whole budget (a strict or local policy, or a regional one
 * at a share of 1) is `subject_exhausted`: the subject used its own budget. A regional bucket holding a part
 * (share < 1) is `share_exhausted`: this region's part is used, and the rest of the budget, in other regions this
 * agent cannot see (borrowing off: `QP_BORROWING=false`, or no coordinator), may still hold tokens. Undefined
 * for a regional check when there is a handler (a charging decision has its reason; a dry run cannot know what
 * borrowing would find) and for a sharded check (`shard_exhausted`, outcome.ts).
 */
export function unborrowedReason(
  check: StoreCheck,
  handler: ShortfallHandler | undefined,
): DecisionReason | undefined {
  if (check.policy.shards !== undefined) return undefined;
  if (check.policy.mode === 'regional' && handler !== undefined) return undefined;
  // The router sizes a regional bucket as capacity × share (core/shares/share-sizing.ts): exact at a share of 1.
  return ownBudgetReason(check.policy, check.bucket.capacity, check.policy.capacity);
}

/** A check's bucket without the subject-creation guard: a missing bucket is created (full) as usual. */
function withoutGuard(check: Check<StoreCheck>): BucketCheck {
  const { bucket } = check.prepared;
  if (bucket.mustExist !== true) return bucket;
  const { mustExist: _, ...unguarded } = bucket;
  return unguarded;
}

/**
 * A group refused by a flood answer `deny`: the flooded checks say `subject_flood`; the others report what their
 * buckets hold (a look: nothing was charged anywhere).
 */
function floodGroup(run: GroupRun, group: StoreGroup, look: Decision, flooded: readonly Flooded[]): GroupRun {
  run.allowed = false;
  group.checks.forEach((c, j) => {
    const p = c.prepared;
    const f = flooded.find((x) => x.index === j);
    const b = look.results[j];
    if (f !== undefined || b === undefined) {
      c.result = floodResult(p, f ?? { index: j, retryAfterMs: 0, answer: 'deny' });
      c.fits = false;
      return;
    }
    const remaining = look.allowed ? Math.min(b.remaining + p.cost, p.bucket.capacity) : b.remaining;
    c.result = {
      policy: p.policy.name,
      allowed: false,
      remaining: remaining > 0 ? remaining : 0,
      limit: p.bucket.capacity,
      resetMs: b.resetMs,
      retryAfterMs: b.retryAfterMs,
      mode: p.policy.mode,
    };
    c.fits = b.retryAfterMs === 0;
  });
  return run;
}

/** Tell the shortfall handler what an admission left in the group's regional buckets. */
function topUp(
  handler: ShortfallHandler | undefined,
  group: StoreGroup,
  decision: Decision,
  generations: readonly (number | undefined)[],
): void {
  if (handler?.admitted === undefined) return;
  const left: ShortCheck[] = [];
  group.checks.forEach(({ prepared: check }, j) => {
    const b = decision.results[j];
    if (borrows(check) && b !== undefined)
      left.push({ check, remaining: b.remaining, generation: generations[j] });
  });
  if (left.length > 0) handler.admitted(left);
}

/** The borrowing checks of a denied group that lacked tokens now but could take their cost after a refill. */
function shortOfTokens(
  group: StoreGroup,
  decision: Decision,
  generations: readonly (number | undefined)[],
): (ShortCheck & { index: number })[] {
  if (decision.allowed || decision.conflict || decision.replayed) return [];
  const out: (ShortCheck & { index: number })[] = [];
  group.checks.forEach(({ prepared: check }, index) => {
    const b = decision.results[index];
    const wait = b?.retryAfterMs;
    if (borrows(check) && b !== undefined && wait !== undefined && wait !== null && wait > 0)
      out.push({ check, remaining: b.remaining, index, generation: generations[index] });
  });
  return out;
}
