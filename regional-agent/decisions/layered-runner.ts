/**
 * The decision of one prepared request, all-or-nothing over its checks: failure modes first, then one call per
 * group (store slots, then the home region), refunds after a denial, the idempotency claim across groups.
 */
import { idempotencyTtlMs } from '../../core/keys.js';
import { AgentErrors } from '../errors.js';
import { newCheck, type Check } from './check.js';
import { groupChecks, type CheckGroup, type HomeGroup } from './check-groups.js';
import type { FailureModes } from './failure-modes.js';
import { runForwardGroup, type ForwardGroupDeps } from './forward-group.js';
import { newRun, type GroupRun } from './group-run.js';
import { runDayGroup } from './day-group.js';
import { runLogGroup, type LogGroupDeps } from './log-group.js';
import {
  boundKey,
  claimIdempotencyKey,
  markAnswered,
  subjectBoundKey,
  wasAnswered,
  type ClaimDeps,
} from './idempotency-claim.js';
import { summarize } from './outcome.js';
import type { DecisionOutcome, PreparedCheck, PreparedRequest } from './prepared.js';
import { refundRuns, type RefundDeps } from './refunds.js';
import { runStoreGroup, type StoreGroupDeps } from './store-group.js';

export type LayeredRunnerDeps = StoreGroupDeps &
  ForwardGroupDeps &
  ClaimDeps &
  RefundDeps &
  LogGroupDeps & {
    failures: FailureModes;
    /**
     * The check of `check`'s policy on its shared bucket (subject-creation cap, flood answer `shared`), routed
     * as a check of the anonymous subject: a store check, or a failure-mode one when this region holds no share.
     */
    sharedCheck: (check: PreparedCheck) => PreparedCheck;
  };

/**
 * Decides a prepared request all-or-nothing: checks with no way to be decided take their failure mode first;
 * then the groups run in order (store slots, then the home region), each charging only if every earlier one
 * admitted; after a denial the rest are only looked at, and what earlier groups were charged is refunded.
 * An idempotency conflict refunds what this call charged and throws.
 */
export class LayeredRunner {
  readonly #deps: LayeredRunnerDeps;
  /** The store's slot of a key, made once rather than per request. */
  readonly #slotOf: (key: string) => number;

  constructor(deps: LayeredRunnerDeps) {
    this.#deps = deps;
    this.#slotOf = (key) => deps.store.slotOf(key);
  }

  /** Throws AGT_ERR_IDEMPOTENCY_CONFLICT, or AGT_ERR_OVERLOADED when the home region shed the request. */
  /** `chargeBy`: epoch ms after which nothing may be charged (a forwarded request's caller stops waiting). */
  async run(request: PreparedRequest, deadlineAt: number, chargeBy?: number): Promise<DecisionOutcome> {
    const { dryRun, idempotencyKey } = request;
    // One object per check travels the steps below, from its routed form to its answer.
    const checks: Check[] = [];
    let denied = false;
    for (let at = 0; at < request.checks.length; at++) {
      const c = newCheck(request.checks[at]!, at);
      checks.push(c);
      const p = c.prepared;
      if (p.route === 'fail' && !this.#deps.failures.fail(c, p.cause, dryRun)) denied = true;
    }

    // Strict checks homed here, in a request that other checks share, are decided after the others as one
    // request of their own, exactly as this region decides them when another region forwards the same request
    // (a group of their own, under the key bound to the whole request): so a retry finds the strict checks'
    // record here whichever region it reaches. Grouped with the other checks here (one slot on a single Redis),
    // they kept their record under another key than a forwarded retry looks for, and a retry through another
    // region charged the strict bucket again (found by review).
    const home = request.forwarded === true ? undefined : strictHere(checks);
    const groups =
      home === undefined
        ? groupChecks(checks, this.#slotOf)
        : [...groupChecks(checks, this.#slotOf, home.others), home.group];
    // Every group of a several-group request keeps its record under the caller's key bound to the whole request
    // (fingerprinted before any reroute to shared buckets changes the checks, so a retry finds the same records).
    // A group's record fingerprints only that group's checks, so under the caller's plain key a one-group request
    // of the same checks would share it: each would replay the other's record without a charge (seed 31).
    // One-group requests (most) keep the caller's key and pay no hash. The claim marks the plain key of each group
    // (idempotency-claim.ts), so a one-group and a several-group request with one key are a conflict, not two
    // requests.
    const groupKey =
      idempotencyKey !== undefined && groups.length > 1 ? boundKey(request, idempotencyKey) : idempotencyKey;
    // The strict checks homed here keep their record under the bound key, where a request forwarded here from
    // another region keeps it; the other checks' records, in the same store here, under a key of their own.
    let localKey = home === undefined || groupKey === undefined ? groupKey : `${groupKey}.here`;
    let sharedKeyed = false;
    // Every group of a several-group request keeps its record as long as the others: the shortest of what each
    // would keep alone. Groups that expired at different times made a late retry replay some groups and decide
    // the others afresh, which the racing-retry check below refuses (a 409 until the last record expired).
    const recordTtlMs =
      idempotencyKey !== undefined && groups.length > 1
        ? idempotencyTtlMs(
            this.#deps.idempotencyTtlMs,
            checks.map((c) => c.prepared.policy.idleTtlSeconds),
          )
        : undefined;
    let claim: Awaited<ReturnType<typeof claimIdempotencyKey>> | undefined;
    if (idempotencyKey !== undefined && groups.length > 1) {
      claim = await claimIdempotencyKey(this.#deps, request, idempotencyKey, groups);
      if (claim === 'conflict') throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
    }

    const runs: GroupRun[] = [];
    let next = 0;
    for (; next < groups.length && !denied; next++) {
      const group = groups[next];
      if (group === undefined) break;
      let run: GroupRun;
      try {
        run = await this.#runGroup(
          request,
          group,
          group.kind === 'home' ? groupKey : localKey,
          recordTtlMs,
          false,
          deadlineAt,
          chargeBy,
        );
        if (run.conflict) throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
        // This request was never seen here (its claim is new, and a claim outlives every record of its key),
        // yet a local group replayed: the record cannot be this request's. Bound keys make this unreachable; kept
        // as a guard, since answering such a record would admit this request without charge.
        if (claim === 'new' && run.replayed && group.kind !== 'forward' && group.kind !== 'home')
          throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
        if (run.reroute !== undefined) {
          // New subjects past their policies' creation caps: nothing was decided; the group's checks are
          // grouped again with those moved to the shared buckets (on a cluster, maybe other slots), and the
          // loop goes on from there. A shared check is never missing, so this happens at most once per check.
          denied = this.#reroute(run.reroute, dryRun) || denied;
          // Groups with checks on a shared bucket keep their records in its slot, fingerprinted by its key, which
          // every new subject shares: bound to this request's subjects, one key from several callers is several
          // requests, not one admission replayed to all (subjectBoundKey).
          if (localKey !== undefined && !sharedKeyed) {
            localKey = subjectBoundKey(request, localKey);
            sharedKeyed = true;
          }
          // The strict checks homed here stay a group of their own, last.
          const later = groups.slice(next);
          const pending = new Set<Check>(later.flatMap((g): Check[] => (g.kind === 'home' ? [] : g.checks)));
          const regrouped = groupChecks(checks, this.#slotOf, pending);
          groups.splice(next, groups.length - next, ...regrouped, ...later.filter((g) => g.kind === 'home'));
          next--;
          continue;
        }
      } catch (error) {
        // A conflict, or a home region that shed the request: give back what this call charged, then say so.
        this.#deps.failures.refund(checks);
        await refundRuns(
          this.#deps,
          runs.filter((r) => r.charged && r.fresh),
        );
        throw error;
      }
      runs.push(run);
      if (!run.allowed) denied = true;
    }
    // After a denial the rest is looked at, not charged: the caller still gets each check's numbers.
    if (next < groups.length) {
      await Promise.all(
        groups
          .slice(next)
          .map((g) =>
            this.#runGroup(
              request,
              g,
              g.kind === 'home' ? groupKey : localKey,
              recordTtlMs,
              true,
              deadlineAt,
            ),
          ),
      );
    }
    // A retry of a several-group request whose groups answer in part from their records and in part afresh is
    // racing its first call: that call wrote the records it got to and may still be denied by a later group,
    // refunding the very grants these replays stand on (two agents, a slow store: found by review). Such a
    // retry is a conflict, as a payment API answers a key still in use: what it charged itself goes back, and
    // the client retries once the first call is answered (all replayed then, or decided afresh after its refund).
    // Only a replayed group of this region counts: the strict checks' group (forwarded, or decided here as their
    // home) runs last and is never refunded, so its record stands whatever became of the call that wrote it. A
    // call whose home charged but whose answer came too late (failed closed, or shed) refunded its own groups;
    // its retry replays the strict record and decides the others afresh, as a retry through another region
    // does. Counting it made every such retry a 409 for as long as the home's record lived (found by review).
    if (
      !denied &&
      runs.length > 1 &&
      claim !== 'new' &&
      runs.some((r) => r.replayed && r.group.kind !== 'forward' && r.group.kind !== 'home') &&
      runs.some((r) => !r.replayed) &&
      // A first call answered admitted with a group its failure mode decided (which kept no record) is over: its
      // retries replay the other groups and decide that one afresh, every time, racing nothing.
      !(
        claim === 'same' &&
        idempotencyKey !== undefined &&
        (await wasAnswered(this.#deps, request, idempotencyKey))
      )
    ) {
      this.#deps.failures.refund(checks);
      await refundRuns(
        this.#deps,
        runs.filter((r) => r.charged && r.fresh),
      );
      throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
    }
    // A group answered from its idempotency record charged nothing now: the grant is the call's that wrote the
    // record, which refunds it itself if it is denied. Refunding it here too gave it back twice when two calls of
    // one key raced and both were denied by a later group (found by the conservation property suite).
    if (denied) this.#deps.failures.refund(checks);
    if (denied)
      await refundRuns(
        this.#deps,
        runs.filter((r) => r.charged && !r.replayed),
      );
    // Admitted, with a group a failure mode answered (no record of it): note it, so a retry is no racing one.
    if (
      !denied &&
      claim !== undefined &&
      idempotencyKey !== undefined &&
      runs.some(
        (r) =>
          r.group.kind !== 'forward' && r.group.kind !== 'home' && r.recordKey === undefined && !r.replayed,
      )
    )
      await markAnswered(this.#deps, request, idempotencyKey, recordTtlMs ?? this.#deps.idempotencyTtlMs);
    const replayed = runs.length > 0 && runs.length === groups.length && runs.every((r) => r.replayed);
    return summarize(checks, !denied, replayed, this.#deps.shortfall);
  }

  /**
   * Move checks to their policies' shared buckets; one that lands on a failure mode (no share of it here) is
   * answered now. True when such an answer denies.
   */
  #reroute(moved: readonly Check[], dryRun: boolean): boolean {
    let denied = false;
    for (const c of moved) {
      const shared = this.#deps.sharedCheck(c.prepared);
      c.prepared = shared;
      if (shared.route === 'fail' && !this.#deps.failures.fail(c, shared.cause, dryRun)) denied = true;
    }
    return denied;
  }

  /**
   * The strict checks homed here of a request with other checks: decided as the request another region forwards
   * here for them (its own groups, claim and records, under `idempotencyKey`, the key bound to the whole request),
   * and written back into the request's checks. Last of the request's groups, as a forwarded group is, so never
   * refunded by a later one.
   */
  async #runHome(
    group: HomeGroup,
    idempotencyKey: string | undefined,
    dryRun: boolean,
    deadlineAt: number,
    chargeBy: number | undefined,
  ): Promise<GroupRun> {
    const run = newRun(group);
    const outcome = await this.run(
      { checks: group.checks.map((c) => c.prepared), idempotencyKey, dryRun, forwarded: true },
      deadlineAt,
      chargeBy,
    );
    run.replayed = outcome.replayed;
    run.allowed = outcome.allowed;
    group.checks.forEach((c, j) => {
      const decided = outcome.checks[j]!;
      c.prepared = decided.prepared;
      c.result = decided.result;
      c.fits = decided.fits;
      c.charge = decided.charge;
    });
    return run;
  }

  #runGroup(
    request: PreparedRequest,
    group: CheckGroup,
    /** The group's idempotency key: the caller's, or bound to the whole request when it has several groups. */
    idempotencyKey: string | undefined,
    /** Its record's TTL, ms, when the request has several groups (one for all of them). */
    recordTtlMs: number | undefined,
    lookOnly: boolean,
    deadlineAt: number,
    chargeBy?: number,
  ): Promise<GroupRun> {
    const dryRun = request.dryRun || lookOnly;
    if (group.kind === 'home') return this.#runHome(group, idempotencyKey, dryRun, deadlineAt, chargeBy);
    if (group.kind === 'forward') {
      return runForwardGroup(this.#deps, { group, idempotencyKey, dryRun, deadlineAt });
    }
    if (group.kind === 'day') {
      return runDayGroup(this.#deps, {
        group,
        idempotencyKey,
        dryRun: request.dryRun,
        lookOnly,
        recordTtlMs,
      });
    }
    if (group.kind === 'log') {
      return runLogGroup(this.#deps, {
        group,
        idempotencyKey,
        dryRun: request.dryRun,
        lookOnly,
        recordTtlMs,
      });
    }
    return runStoreGroup(this.#deps, {
      group,
      idempotencyKey,
      dryRun: request.dryRun,
      lookOnly,
      deadlineAt,
      chargeBy,
      recordTtlMs,
      noTopUp: request.reservation,
    });
  }
}

/**
 * The strict checks homed in this region, as a group of their own, and the request's other checks, when the
 * request holds both (checks routed to a failure mode belong to no group and do not count); undefined otherwise.
 */
function strictHere(checks: readonly Check[]): { group: HomeGroup; others: Set<Check> } | undefined {
  // Most requests are one check, or hold no strict check: nothing is allocated for them.
  if (checks.length < 2) return undefined;
  let strict = 0;
  let other = 0;
  for (const c of checks) {
    const p = c.prepared;
    if (p.route === 'fail' || p.route === 'forward') continue;
    if (p.policy.mode === 'strict') strict++;
    else other++;
  }
  if (strict === 0 || other === 0) return undefined;
  const group: HomeGroup = { kind: 'home', checks: [] };
  const others = new Set<Check>();
  for (const c of checks) {
    const p = c.prepared;
    if (p.route !== 'fail' && p.route !== 'forward' && p.policy.mode === 'strict') group.checks.push(c);
    else if (p.route !== 'fail') others.add(c);
  }
  return { group, others };
}
