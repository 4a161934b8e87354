/**
 * The decision path: from a validated request to one decision. Sizes every bucket from the ShareView, groups
 * checks by cluster slot (one script per slot, in order, refunding earlier grants when a later slot denies),
 * forwards strict policies homed elsewhere, applies each policy's failure mode when the store, the home region
 * or the lease is missing, and keeps every decision within its deadline.
 */
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import {
  LayeredDecisionRequest,
  MAX_CHECKS_PER_REQUEST,
  SingleDecisionRequest,
  checksOf,
  looksValidDecisionRequest,
  type CheckResult,
  type DecisionReason,
  type DecisionRequest,
  type DegradedCause,
} from '../../core/agent-wire.js';
import type { BucketCheck, Decision } from '../../core/bucket-wire.js';
import type { Clock } from '../../core/clock.js';
import { bucketKey, idempotencyRecordKey } from '../../core/keys.js';
import type { Policy } from '../../core/policy.js';
import type { PolicySource } from '../../core/policy-source.js';
import type { RegionalShare, ShareView } from '../../core/shares.js';
import { normalizeSubject, subjectFingerprint } from '../../core/subject.js';
import { AgentErrors, withProblems } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { DecisionStore } from './decision-store.js';
import type { EmergencyBuckets } from './emergency-buckets.js';
import type { ForwardedDecision, ForwardedReply } from '../../core/wire/strict.js';
import type { Forwarder } from './forwarder.js';

export interface DecisionServiceConfig {
  region: string;
  /** Longest a decision may take, every store call included. */
  deadlineMs: number;
  hmacSecret?: string | undefined;
  idempotencyTtlMs: number;
  /** Retry hint for checks denied because something failed (the breaker's reset time). */
  failureRetryAfterMs: number;
  /** Fraction of decisions logged. */
  logSampleRate: number;
}

export interface DecisionServiceDeps {
  store: DecisionStore;
  guard: StoreGuard;
  policies: PolicySource;
  shares: ShareView;
  emergency: EmergencyBuckets;
  metrics: AgentMetrics;
  clock: Clock;
  random: () => number;
  log: Logger;
  forwarder?: Forwarder | undefined;
  /** Counts regional decisions for the usage reports the coordinator rebalances on. */
  usage?: UsageSink | undefined;
}

/** Where decided checks are counted for usage reports (regional-agent/reporting/usage-recorder.ts). */
export interface UsageSink {
  record(policy: string, subject: string, cost: number, allowed: boolean, remainingFraction: number): void;
}

/** One check, validated and routed. */
interface Prepared {
  policy: Policy;
  subject: string;
  cost: number;
  /** `store`: decided by our bucket store; `forward`: by the home region; `fail`: the failure mode applies now. */
  route: 'store' | 'forward' | 'fail';
  bucket: BucketCheck | undefined;
  cause: DegradedCause | undefined;
  homeRegion: string | undefined;
}

/** A request the service accepted. */
export interface PreparedRequest {
  checks: Prepared[];
  idempotencyKey: string | undefined;
  dryRun: boolean;
}

/** The decision, before it is put on the wire. */
export interface DecisionOutcome {
  allowed: boolean;
  retryAfterMs: number | null;
  results: CheckResult[];
  replayed: boolean;
  /** Per result: true when that check did not fit (it is why the request was denied). */
  violated: boolean[];
  /** Per result: the policy's window (seconds to refill from empty), for RateLimit-Policy. */
  windows: number[];
  /** True when the denial comes only from fail-closed failures (store, home region, lease), not from quota. */
  unavailable: boolean;
}

/** A group of checks decided together (one slot, or one home region), and how it went. */
interface Group {
  indexes: number[];
  kind: 'store' | 'forward';
  slotSubject: string;
  homeRegion?: string | undefined;
}

interface GroupRun {
  group: Group;
  allowed: boolean;
  /** True when the store charged these buckets now or earlier (replay): a later denial must refund them. */
  charged: boolean;
  replayed: boolean;
  fresh: boolean;
  conflict: boolean;
  recordKey: string | undefined;
}

const CLOSED_REASONS: ReadonlySet<string> = new Set(['store_unavailable', 'home_unreachable', 'no_lease']);
const FULL_SHARE: RegionalShare = Object.freeze({ share: 1, epoch: 0 });

export class DecisionService {
  readonly #config: DecisionServiceConfig;
  readonly #deps: DecisionServiceDeps;

  constructor(deps: DecisionServiceDeps, config: DecisionServiceConfig) {
    this.#deps = deps;
    this.#config = config;
  }

  /** Validate a body: every problem of the kind found first is listed. Throws an agent error; changes nothing. */
  parse(body: unknown): DecisionRequest {
    if (looksValidDecisionRequest(body)) return body;
    if (typeof body === 'object' && body !== null && 'checks' in body) {
      const checks = body.checks;
      if (Array.isArray(checks) && checks.length > MAX_CHECKS_PER_REQUEST) {
        throw new AgentErrors.AGT_ERR_TOO_MANY_CHECKS(MAX_CHECKS_PER_REQUEST, checks.length);
      }
    }
    const schema =
      typeof body === 'object' && body !== null && 'checks' in body
        ? LayeredDecisionRequest
        : SingleDecisionRequest;
    const parsed = schema.safeParse(body);
    if (parsed.success) return parsed.data;
    const problems = parsed.error.issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`);
    const costIssue = parsed.error.issues.some((i) => i.path[i.path.length - 1] === 'cost');
    const error = costIssue
      ? new AgentErrors.AGT_ERR_INVALID_COST(problems.join('; '))
      : new AgentErrors.AGT_ERR_INVALID_REQUEST(problems.join('; '));
    throw withProblems(error, problems);
  }

  /** Look up policies, normalize subjects, check costs and route each check. Throws an agent error. */
  prepare(request: DecisionRequest): PreparedRequest {
    const policies = this.#deps.policies.current();
    const wire = checksOf(request);
    const out: Prepared[] = new Array<Prepared>(wire.length);
    let unknown: string[] | undefined;
    let badSubjects: string[] | undefined;
    let badCosts: string[] | undefined;
    for (let i = 0; i < wire.length; i++) {
      const c = wire[i]!;
      const policy = policies.get(c.policy);
      const subject = normalizeSubject(c.subject, { hmacSecret: this.#config.hmacSecret });
      if (policy === undefined) (unknown ??= []).push(c.policy);
      if (!subject.ok)
        (badSubjects ??= []).push(wire.length > 1 ? `checks.${i}: ${subject.reason}` : subject.reason);
      const cost = c.cost ?? 1;
      if (policy !== undefined && cost > policy.maxCost) {
        (badCosts ??= []).push(`${cost} > maxCost ${policy.maxCost} of ${policy.name}`);
      }
      if (policy !== undefined && subject.ok) {
        out[i] = this.#route(policy, subject.subject, cost);
      }
    }
    if (unknown !== undefined) {
      throw withProblems(
        new AgentErrors.AGT_ERR_UNKNOWN_POLICY(unknown.join(', ')),
        unknown.map((p) => `unknown policy ${p}`),
      );
    }
    if (badSubjects !== undefined) {
      throw withProblems(new AgentErrors.AGT_ERR_INVALID_SUBJECT(badSubjects.join('; ')), badSubjects);
    }
    if (badCosts !== undefined) {
      const first = wire.find((c) => (c.cost ?? 1) > policies.get(c.policy)!.maxCost)!;
      const policy = policies.get(first.policy)!;
      throw withProblems(
        new AgentErrors.AGT_ERR_COST_ABOVE_MAX(first.cost ?? 1, policy.name, policy.maxCost),
        badCosts,
      );
    }
    if (out.length > 1) {
      const seen = new Set<string>();
      const homes = new Set<string>();
      for (const p of out) {
        const id = `${p.policy.name}\u0000${p.subject}`;
        if (seen.has(id)) throw new AgentErrors.AGT_ERR_DUPLICATE_CHECK(p.policy.name);
        seen.add(id);
        if (p.route === 'forward') homes.add(p.homeRegion!);
      }
      if (homes.size > 1) throw new AgentErrors.AGT_ERR_MIXED_HOME_REGIONS([...homes].join(', '));
    }
    return { checks: out, idempotencyKey: request.idempotencyKey, dryRun: request.dryRun === true };
  }

  #route(policy: Policy, subject: string, cost: number): Prepared {
    // Every branch builds the same object shape: this runs for every check of every request.
    if (policy.mode === 'strict' && policy.homeRegion !== this.#config.region) {
      const reachable = this.#deps.forwarder !== undefined;
      return {
        policy,
        subject,
        cost,
        route: reachable ? 'forward' : 'fail',
        bucket: undefined,
        cause: reachable ? undefined : 'home_unreachable',
        homeRegion: policy.homeRegion,
      };
    }
    // local and strict-at-home enforce the whole budget here; regional enforces this region's share.
    const share = policy.mode === 'regional' ? this.#deps.shares.shareFor(policy.name, subject) : FULL_SHARE;
    if (share === undefined) {
      return {
        policy,
        subject,
        cost,
        route: 'fail',
        bucket: undefined,
        cause: 'no_lease',
        homeRegion: undefined,
      };
    }
    const s = share.share;
    const bucket: BucketCheck = {
      key: bucketKey(policy.version, subject, policy.name),
      capacity: policy.capacity * s,
      refillPerSecond: policy.refillPerSecond * s,
      cost,
      ttlMs: policy.idleTtlSeconds * 1000,
    };
    const floor = share.floor;
    if (floor !== undefined) {
      bucket.floor = {
        beforeMicros: Math.max(0, Math.round(floor.sinceMs * 1000)),
        refillPerSecond: policy.refillPerSecond * floor.share,
        capacity: policy.capacity * floor.share,
      };
    }
    return { policy, subject, cost, route: 'store', bucket, cause: undefined, homeRegion: undefined };
  }

  /**
   * Decide a body end to end: parse, prepare, decide. Throws agent errors for bad input (nothing changed) and
   * for an idempotency conflict; every other outcome, failures included, is a decision.
   */
  async decideBody(body: unknown, requestId: string): Promise<DecisionOutcome> {
    return this.decide(this.prepare(this.parse(body)), requestId);
  }

  /** Decide a prepared request within the deadline (or `deadlineMs`, when shorter). */
  async decide(request: PreparedRequest, requestId: string, deadlineMs?: number): Promise<DecisionOutcome> {
    const started = this.#deps.clock.now();
    const deadlineAt = started + Math.min(this.#config.deadlineMs, deadlineMs ?? Infinity);
    const { checks } = request;
    // Entered before any share is used, left when the decision is over: the lease holder acknowledges a new
    // epoch only after every decision begun under the old one finished.
    const leave: (() => void)[] = [];
    for (const p of checks) leave.push(this.#deps.shares.enter(p.policy.name));
    try {
      const outcome = await this.#decide(request, deadlineAt);
      this.#record(request, outcome, requestId, started);
      return outcome;
    } finally {
      for (const done of leave) done();
    }
  }

  /**
   * Decide checks another region forwarded here, to its home (strict mode): same buckets and idempotency records
   * as a local call, within what is left of the caller's deadline. Subjects arrive normalized. Answers an error
   * code instead of results when the request is not for this home, names an unknown policy, or conflicts.
   */
  async decideForwarded(request: ForwardedDecision, requestId: string): Promise<ForwardedReply> {
    const policies = this.#deps.policies.current();
    const checks: Prepared[] = [];
    for (const c of request.checks) {
      const policy = policies.get(c.policy);
      if (policy === undefined) return { error: 'unknown_policy', message: `unknown policy ${c.policy}` };
      if (policy.mode !== 'strict' || policy.homeRegion !== this.#config.region) {
        return {
          error: 'not_home',
          message: `${c.policy} is not a strict policy homed in ${this.#config.region}`,
        };
      }
      if (c.cost > policy.maxCost) {
        return {
          error: 'invalid_request',
          message: `cost ${c.cost} is above maxCost ${policy.maxCost} of ${policy.name}`,
        };
      }
      checks.push(this.#route(policy, c.subject, c.cost));
    }
    try {
      const outcome = await this.decide(
        { checks, idempotencyKey: request.idempotencyKey, dryRun: request.dryRun },
        requestId,
        request.budgetMs,
      );
      return outcome.replayed ? { results: outcome.results, replayed: true } : { results: outcome.results };
    } catch (error) {
      if (error instanceof AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT) {
        return { error: 'idempotency_conflict', message: error.message };
      }
      throw error;
    }
  }

  async #decide(request: PreparedRequest, deadlineAt: number): Promise<DecisionOutcome> {
    const { checks } = request;
    const n = checks.length;
    const results = new Array<CheckResult>(n);
    const fits = new Array<boolean>(n).fill(true);
    let denied = false;

    for (let i = 0; i < n; i++) {
      const p = checks[i]!;
      if (p.route !== 'fail') continue;
      const r = this.#failure(p, p.cause!, request.dryRun);
      results[i] = r.result;
      fits[i] = r.fits;
      if (!r.fits) denied = true;
    }

    const groups = this.#groups(checks);
    const runs: GroupRun[] = [];
    let conflict = false;
    if (request.idempotencyKey !== undefined && groups.length > 1) {
      const claim = await this.#claim(request, request.idempotencyKey, deadlineAt);
      if (claim === 'conflict') throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
    }

    let next = 0;
    for (; next < groups.length && !denied; next++) {
      const run = await this.#runGroup(request, groups[next]!, false, deadlineAt, results, fits);
      if (run.conflict) {
        conflict = true;
        break;
      }
      runs.push(run);
      if (!run.allowed) denied = true;
    }
    if (conflict) {
      await this.#refund(
        request,
        runs.filter((r) => r.charged && r.fresh),
        deadlineAt,
        results,
      );
      throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
    }
    // After a denial the rest is looked at, not charged: the caller still gets each check's numbers.
    if (next < groups.length) {
      await Promise.all(
        groups.slice(next).map((g) => this.#runGroup(request, g, true, deadlineAt, results, fits)),
      );
    }
    if (denied) {
      await this.#refund(
        request,
        runs.filter((r) => r.charged),
        deadlineAt,
        results,
      );
    }

    const allowed = !denied;
    let retryAfterMs: number | null = 0;
    let quota = false;
    let unavailable = false;
    const violated = new Array<boolean>(n);
    const windows = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const r = results[i]!;
      const p = checks[i]!;
      windows[i] = Math.ceil(p.policy.capacity / p.policy.refillPerSecond);
      violated[i] = !fits[i];
      if (!allowed) {
        r.allowed = false;
        if (!fits[i]) {
          if (r.reason !== undefined && CLOSED_REASONS.has(r.reason)) unavailable = true;
          else quota = true;
          if (retryAfterMs !== null)
            retryAfterMs = r.retryAfterMs === null ? null : Math.max(retryAfterMs, r.retryAfterMs);
        }
      }
    }
    if (allowed) retryAfterMs = 0;
    const replayed = runs.length > 0 && runs.length === groups.length && runs.every((r) => r.replayed);
    return {
      allowed,
      retryAfterMs,
      results,
      replayed,
      violated,
      windows,
      unavailable: unavailable && !quota,
    };
  }

  /** Store checks grouped by slot in order of first appearance, then the forwarded checks. */
  #groups(checks: Prepared[]): Group[] {
    if (checks.length === 1) {
      const p = checks[0]!;
      if (p.route === 'fail') return [];
      return [{ indexes: [0], kind: p.route, slotSubject: p.subject, homeRegion: p.homeRegion }];
    }
    const groups: Group[] = [];
    const bySlot = new Map<number, Group>();
    let forward: Group | undefined;
    for (let i = 0; i < checks.length; i++) {
      const p = checks[i]!;
      if (p.route === 'store') {
        const slot = checks.length === 1 ? 0 : this.#deps.store.slotOf(p.bucket!.key);
        let g = bySlot.get(slot);
        if (g === undefined) {
          g = { indexes: [], kind: 'store', slotSubject: p.subject };
          bySlot.set(slot, g);
          groups.push(g);
        }
        g.indexes.push(i);
      } else if (p.route === 'forward') {
        forward ??= { indexes: [], kind: 'forward', slotSubject: p.subject, homeRegion: p.homeRegion };
        forward.indexes.push(i);
      }
    }
    if (forward !== undefined) groups.push(forward);
    return groups;
  }

  /**
   * A request spanning several store groups claims its idempotency key once for the whole request, so the same
   * key on a different request is refused before anything is charged. One group needs no claim: the script's
   * own record catches the conflict.
   */
  async #claim(
    request: PreparedRequest,
    idempotencyKey: string,
    deadlineAt: number,
  ): Promise<'new' | 'same' | 'conflict' | 'none'> {
    const key = `${idempotencyRecordKey(request.checks[0]!.subject, idempotencyKey)}:req`;
    const fingerprint = createHash('sha1')
      .update(
        request.checks.map((p) => `${p.policy.name}/${p.policy.version} ${p.subject} ${p.cost}`).join('\n'),
      )
      .digest('hex');
    try {
      const outcome = await this.#deps.guard.run(
        'claim',
        () => this.#deps.store.claim(key, fingerprint, this.#config.idempotencyTtlMs, request.dryRun),
        deadlineAt - this.#deps.clock.now(),
      );
      if (outcome === 'conflict') this.#deps.metrics.idempotency.labels('conflict').inc();
      return outcome;
    } catch {
      // Without the claim the per-slot records still replay retries; only cross-request conflicts go unseen.
      return 'none';
    }
  }

  async #runGroup(
    request: PreparedRequest,
    group: Group,
    lookOnly: boolean,
    deadlineAt: number,
    results: CheckResult[],
    fits: boolean[],
  ): Promise<GroupRun> {
    const dryRun = request.dryRun || lookOnly;
    const run: GroupRun = {
      group,
      allowed: true,
      charged: false,
      replayed: false,
      fresh: false,
      conflict: false,
      recordKey: undefined,
    };
    const checks = request.checks;
    if (group.kind === 'forward') {
      return this.#runForward(request, group, dryRun, deadlineAt, results, fits, run);
    }
    const buckets = group.indexes.map((i) => checks[i]!.bucket!);
    const recordKey =
      request.idempotencyKey === undefined
        ? undefined
        : idempotencyRecordKey(group.slotSubject, request.idempotencyKey);
    let decision: Decision;
    try {
      decision = await this.#deps.guard.run(
        'decide',
        () =>
          this.#deps.store.decide({
            checks: buckets,
            dryRun,
            idempotency:
              recordKey === undefined ? undefined : { key: recordKey, ttlMs: this.#config.idempotencyTtlMs },
          }),
        deadlineAt - this.#deps.clock.now(),
      );
    } catch {
      return this.#failGroup(group, checks, dryRun, results, fits, run);
    }
    if (decision.conflict) {
      this.#deps.metrics.idempotency.labels('conflict').inc();
      run.conflict = true;
      run.allowed = false;
      return run;
    }
    if (recordKey !== undefined && !lookOnly) {
      this.#deps.metrics.idempotency.labels(decision.replayed ? 'replayed' : 'new').inc();
    }
    run.allowed = decision.allowed;
    run.replayed = decision.replayed;
    run.fresh = !decision.replayed && !dryRun;
    run.charged = decision.allowed && !dryRun;
    run.recordKey = recordKey;
    for (let j = 0; j < group.indexes.length; j++) {
      const i = group.indexes[j]!;
      const p = checks[i]!;
      const b = decision.results[j]!;
      // A group only looked at (an earlier one denied) reports what it holds, not what it would after paying.
      const remaining =
        lookOnly && decision.allowed ? Math.min(b.remaining + p.cost, p.bucket!.capacity) : b.remaining;
      const result: CheckResult = {
        policy: p.policy.name,
        allowed: decision.allowed,
        remaining: remaining > 0 ? remaining : 0,
        limit: p.bucket!.capacity,
        resetMs: b.resetMs,
        retryAfterMs: b.retryAfterMs,
        mode: p.policy.mode,
      };
      if (b.retryAfterMs === null) result.reason = 'cost_exceeds_share';
      results[i] = result;
      fits[i] = b.retryAfterMs === 0;
    }
    return run;
  }

  async #runForward(
    request: PreparedRequest,
    group: Group,
    dryRun: boolean,
    deadlineAt: number,
    results: CheckResult[],
    fits: boolean[],
    run: GroupRun,
  ): Promise<GroupRun> {
    const checks = request.checks;
    try {
      // Earlier groups may have used the whole deadline: then nothing is sent (a request the caller gives up
      // on before it starts would only charge the home bucket for an answer nobody reads).
      const budgetMs = deadlineAt - this.#deps.clock.now();
      if (budgetMs <= 0) throw new Error('deadline passed before forwarding');
      const remote = await withDeadline(
        this.#deps.forwarder!.decide(
          group.homeRegion!,
          {
            checks: group.indexes.map((i) => ({
              policy: checks[i]!.policy.name,
              subject: checks[i]!.subject,
              cost: checks[i]!.cost,
            })),
            idempotencyKey: request.idempotencyKey,
            dryRun,
          },
          budgetMs,
        ),
        budgetMs,
      );
      let allowed = true;
      run.replayed = remote.replayed === true;
      group.indexes.forEach((i, j) => {
        const r = remote.results[j]!;
        results[i] = r;
        fits[i] = r.retryAfterMs === 0;
        if (!r.allowed) allowed = false;
      });
      run.allowed = allowed;
      return run;
    } catch (error) {
      // The home region decided that this idempotency key answers another request: the caller's error.
      if (error instanceof AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT) throw error;
      for (const i of group.indexes) checks[i]!.cause = 'home_unreachable';
      return this.#failGroup(group, checks, dryRun, results, fits, run);
    }
  }

  /** The store (or home region) gave no answer: each check gets its policy's failure mode. */
  #failGroup(
    group: Group,
    checks: Prepared[],
    dryRun: boolean,
    results: CheckResult[],
    fits: boolean[],
    run: GroupRun,
  ): GroupRun {
    const local: number[] = [];
    for (const i of group.indexes) {
      const p = checks[i]!;
      const cause = p.cause ?? 'store_unavailable';
      if (p.policy.onStoreFailure === 'local' && p.bucket !== undefined) {
        local.push(i);
        continue;
      }
      const r = this.#failure(p, cause, dryRun);
      results[i] = r.result;
      fits[i] = r.fits;
      if (!r.fits) run.allowed = false;
    }
    if (local.length > 0) {
      const sized = local.map((i) => this.#deps.emergency.size(checks[i]!.policy, checks[i]!.bucket!));
      const decision = this.#deps.emergency.decide(sized, dryRun);
      local.forEach((i, j) => {
        const p = checks[i]!;
        if (decision === undefined) {
          const r = this.#closed(p, 'emergency_full');
          results[i] = r;
          fits[i] = false;
          run.allowed = false;
          return;
        }
        const b = decision.results[j]!;
        results[i] = {
          policy: p.policy.name,
          allowed: decision.allowed,
          remaining: b.remaining > 0 ? b.remaining : 0,
          limit: sized[j]!.capacity,
          resetMs: b.resetMs,
          retryAfterMs: b.retryAfterMs,
          mode: p.policy.mode,
          reason: 'emergency_bucket',
          cause: p.cause ?? 'store_unavailable',
        };
        fits[i] = b.retryAfterMs === 0;
        if (!decision.allowed) run.allowed = false;
      });
    }
    return run;
  }

  /** A failure-mode result for a check that nothing could decide (no store answer, no lease, no home). */
  #failure(p: Prepared, cause: DegradedCause, dryRun: boolean): { result: CheckResult; fits: boolean } {
    const mode = p.policy.onStoreFailure;
    if (mode === 'open') {
      return {
        fits: true,
        result: {
          policy: p.policy.name,
          allowed: true,
          remaining: 0,
          limit: p.bucket?.capacity ?? 0,
          resetMs: null,
          retryAfterMs: 0,
          mode: p.policy.mode,
          reason: 'fail_open',
          cause,
        },
      };
    }
    if (mode === 'local' && p.bucket === undefined) {
      // Without a share (no lease) or a home region there is nothing to size an emergency bucket from.
      return { fits: false, result: this.#closed(p, cause) };
    }
    if (mode === 'local') {
      const sized = this.#deps.emergency.size(p.policy, p.bucket!);
      const decision = this.#deps.emergency.decide([sized], dryRun);
      if (decision === undefined) return { fits: false, result: this.#closed(p, 'emergency_full') };
      const b = decision.results[0]!;
      return {
        fits: b.retryAfterMs === 0,
        result: {
          policy: p.policy.name,
          allowed: decision.allowed,
          remaining: b.remaining > 0 ? b.remaining : 0,
          limit: sized.capacity,
          resetMs: b.resetMs,
          retryAfterMs: b.retryAfterMs,
          mode: p.policy.mode,
          reason: 'emergency_bucket',
          cause,
        },
      };
    }
    return { fits: false, result: this.#closed(p, cause) };
  }

  #closed(p: Prepared, cause: DegradedCause): CheckResult {
    const reason: DecisionReason = cause === 'emergency_full' ? 'store_unavailable' : cause;
    const result: CheckResult = {
      policy: p.policy.name,
      allowed: false,
      remaining: 0,
      limit: p.bucket?.capacity ?? 0,
      resetMs: null,
      retryAfterMs: this.#config.failureRetryAfterMs,
      mode: p.policy.mode,
      reason,
    };
    if (cause !== reason) result.cause = cause;
    return result;
  }

  /** Give back what earlier groups were charged, so no grant survives a later denial. */
  async #refund(
    request: PreparedRequest,
    runs: GroupRun[],
    deadlineAt: number,
    results: CheckResult[],
  ): Promise<void> {
    if (runs.length === 0) return;
    await Promise.all(
      runs.map(async (run) => {
        const checks = run.group.indexes.map((i) => request.checks[i]!);
        try {
          const outcome = await this.#deps.guard.run(
            'refund',
            () =>
              this.#deps.store.refund({
                checks: checks.map((p) => ({
                  key: p.bucket!.key,
                  cost: p.cost,
                  capacity: p.bucket!.capacity,
                })),
                idempotencyRecordKey: run.recordKey,
              }),
            // A refund is worth a little time past the deadline: without it a grant survives.
            Math.max(deadlineAt - this.#deps.clock.now(), this.#config.deadlineMs),
          );
          run.group.indexes.forEach((i, j) => {
            const tokens = outcome.results[j]!.tokens;
            if (tokens !== null) results[i]!.remaining = tokens;
          });
          this.#deps.metrics.refunds.labels('ok').inc();
        } catch (error) {
          this.#deps.metrics.refunds.labels('failed').inc();
          this.#deps.log.warn(
            { err: error, policies: checks.map((p) => p.policy.name) },
            'refund failed: an earlier grant stands',
          );
        }
      }),
    );
  }

  #record(request: PreparedRequest, outcome: DecisionOutcome, requestId: string, started: number): void {
    const { metrics, log, usage } = this.#deps;
    const region = this.#config.region;
    for (let i = 0; i < outcome.results.length; i++) {
      const r = outcome.results[i]!;
      const p = request.checks[i]!;
      if (!request.dryRun) metrics.countDecision(p.policy.name, outcome.allowed, p.policy.mode);
      // Demand the coordinator follows: regional policies decided by this region's store (not failure modes).
      if (usage !== undefined && !request.dryRun && p.policy.mode === 'regional' && p.route === 'store') {
        const left = outcome.violated[i] || r.limit <= 0 ? 0 : r.remaining / r.limit;
        usage.record(p.policy.name, p.subject, p.cost, outcome.allowed, left);
      }
      if (r.reason !== undefined)
        metrics.degraded.labels(p.policy.name, region, r.reason, r.cause ?? '').inc();
    }
    if (!outcome.allowed && outcome.retryAfterMs !== null && !request.dryRun) {
      const first = outcome.violated.indexOf(true);
      const policy = first >= 0 ? request.checks[first]!.policy.name : request.checks[0]!.policy.name;
      metrics.retryAfter.labels(policy, region).observe(outcome.retryAfterMs / 1000);
    }
    if (this.#deps.random() < this.#config.logSampleRate) {
      log.info(
        {
          reqId: requestId,
          policies: request.checks.map((p) => p.policy.name),
          subjects: request.checks.map((p) => subjectFingerprint(p.subject)),
          allowed: outcome.allowed,
          reasons: outcome.results.map((r) => r.reason ?? null),
          replayed: outcome.replayed,
          ms: Math.round((this.#deps.clock.now() - started) * 100) / 100,
        },
        'decision',
      );
    }
  }
}

/**
 * `promise`, or a rejection once `ms` pass first. The promise is always observed: a late rejection of a call the
 * deadline gave up on must not surface as an unhandled rejection, which ends the process.
 */
function withDeadline<T>(promise: Promise<T>, ms: number): Promise<T> {
  if (ms <= 0) {
    promise.catch(() => undefined);
    return Promise.reject(new Error('deadline passed'));
  }
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no answer within ${Math.round(ms)} ms`)), ms);
    promise.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e instanceof Error ? e : new Error(String(e)));
      },
    );
  });
}
