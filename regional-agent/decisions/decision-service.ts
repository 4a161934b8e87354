/**
 * The decision path, from a validated request to one decision. Its steps live beside it, and each check of a
 * request travels them as one object (check.ts) that holds its routed form and, once decided, its outcome:
 * - request-parser.ts and check-router.ts validate a body and route each check (own store, home region, or
 *   failure mode), sizing every bucket from the ShareView;
 * - layered-runner.ts decides the checks all-or-nothing: check-groups.ts groups them by cluster slot,
 *   store-group.ts, log-group.ts, day-group.ts and forward-group.ts decide one group, refunds.ts gives back
 *   earlier grants after a later denial, idempotency-claim.ts guards keys across groups, failure-modes.ts
 *   answers for what nothing decided, and outcome.ts makes the request's answer; a store group short of this
 *   region's tokens asks borrowing through its port (borrowing-port.ts);
 * - decision-recorder.ts counts, reports usage and logs what was decided.
 */
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { DecisionRequest } from '../../core/wire/agent.js';
import type { LeaseKey } from '../../core/concurrency.js';
import type { Clock } from '../../core/clock.js';
import { hasOwnKey } from '../../core/own-keys.js';
import { kindOf } from '../../core/kinds/index.js';
import { withClass } from '../../core/policy/policy.js';
import type { PolicySource } from '../policies/policy-source.js';
import type { ShareView } from '../../core/shares/shares.js';
import { ANONYMOUS_SUBJECT } from '../../core/models/subject-creation.js';
import type { ForwardedDecision, ForwardedReply } from '../../core/wire/strict.js';
import { AgentErrors, shedPathOf } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import { CheckRouter } from './check-router.js';
import { DecisionRecorder, type UsageSink } from './decision-recorder.js';
import type { DecisionStore } from './decision-store.js';
import type { EmergencyBuckets } from './emergency-buckets.js';
import { FailureModes } from './failure-modes.js';
import type { Forwarder } from './forwarder.js';
import { LayeredRunner } from './layered-runner.js';
import { CreationFlights } from './subject-gate.js';
import type { DecisionOutcome, PreparedCheck, PreparedRequest } from './prepared.js';
import type { RefusalMemory } from './refusal-memory.js';
import { parseDecisionRequest } from './request-parser.js';
import type { ShortfallHandler } from './borrowing-port.js';

export type { DecisionOutcome, PreparedRequest } from './prepared.js';
export type { UsageSink } from './decision-recorder.js';
export type { ShortfallHandler } from './borrowing-port.js';

export interface DecisionServiceConfig {
  region: string;
  /** Longest a decision may take, every store call included. */
  deadlineMs: number;
  hmacSecret?: string | undefined;
  /** Signs the lease tokens of concurrency checks (core/concurrency.ts); random per service when not given. */
  leaseKey?: LeaseKey | undefined;
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
  /** Borrowing, through its port: tries to cover a regional check refused for lack of this region's tokens. */
  shortfall?: ShortfallHandler | undefined;
  /** Keeps each (policy, subject)'s last refusal for `GET /v1/explain`. */
  refusals?: RefusalMemory | undefined;
}

export class DecisionService {
  readonly #config: DecisionServiceConfig;
  readonly #deps: DecisionServiceDeps;
  readonly #router: CheckRouter;
  readonly #runner: LayeredRunner;
  readonly #recorder: DecisionRecorder;

  constructor(deps: DecisionServiceDeps, config: DecisionServiceConfig) {
    this.#deps = deps;
    this.#config = config;
    this.#router = new CheckRouter(deps.policies, deps.shares, {
      region: config.region,
      hmacSecret: config.hmacSecret,
      canForward: deps.forwarder !== undefined,
      now: () => deps.clock.now(),
      random: deps.random,
    });
    this.#runner = new LayeredRunner({
      ...deps,
      failures: new FailureModes(deps.emergency, config.failureRetryAfterMs),
      idempotencyTtlMs: config.idempotencyTtlMs,
      creations: new CreationFlights(),
      region: config.region,
      leaseKey: config.leaseKey ?? randomBytes(32),
      sharedCheck: (check) => this.#sharedCheck(check),
    });
    this.#recorder = new DecisionRecorder(deps, config);
  }

  /**
   * A check moved to its policy's shared bucket: the policy's own limits (a subject's, not a class's), routed as
   * a check of the anonymous subject, so its share, borrowing and usage are that subject's.
   */
  #sharedCheck(check: PreparedCheck): PreparedCheck {
    const policy = this.#deps.policies.current().get(check.policy.name) ?? check.policy;
    return this.#router.route(policy, ANONYMOUS_SUBJECT, check.cost);
  }

  /** Validate a body: every problem of the kind found first is listed. Throws an agent error; changes nothing. */
  parse(body: unknown): DecisionRequest {
    return parseDecisionRequest(body);
  }

  /**
   * Look up policies, normalize subjects, check costs and route each check. Throws an agent error. `repeats[i]`:
   * how many requests of up to `maxCost` each check `i` merges (the rate-limit service's same-bucket descriptors).
   */
  prepare(request: DecisionRequest, repeats?: readonly number[]): PreparedRequest {
    return this.#router.prepare(request, repeats);
  }

  /**
   * Decide a body end to end: parse, prepare, decide. Throws agent errors for bad input (nothing changed) and
   * for an idempotency conflict; every other outcome, failures included, is a decision.
   */
  async decideBody(body: unknown, requestId: string): Promise<DecisionOutcome> {
    return this.decide(this.prepare(this.parse(body)), requestId);
  }

  /**
   * Decide a prepared request within the deadline (or `deadlineMs`, when shorter). With `chargeBy` (epoch ms,
   * a forwarding region's deadline) nothing is charged after it: the request is shed instead.
   */
  async decide(
    request: PreparedRequest,
    requestId: string,
    deadlineMs?: number,
    chargeBy?: number,
  ): Promise<DecisionOutcome> {
    const started = this.#deps.clock.now();
    const deadlineAt = started + Math.min(this.#config.deadlineMs, deadlineMs ?? Infinity);
    // Entered before any share is used, left when the decision is over: the lease holder acknowledges a new
    // epoch only after every decision begun under the old one finished.
    const leave = request.checks.map((p) => this.#deps.shares.enter(p.policy.name));
    try {
      const outcome = await this.#runner.run(request, deadlineAt, chargeBy);
      this.#recorder.record(request, outcome, requestId, started);
      return outcome;
    } catch (error) {
      // Shed after admission (a deadline, or a home region that shed it): counted by where it was shed.
      const path = shedPathOf(error);
      if (path !== undefined)
        this.#deps.metrics.shedAfterAdmission.labels(this.#deps.metrics.region, path).inc();
      throw error;
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
    const checks: PreparedCheck[] = [];
    for (const c of request.checks) {
      const named = policies.get(c.policy);
      if (named === undefined) return { error: 'unknown_policy', message: `unknown policy ${c.policy}` };
      if (c.class !== undefined && !hasOwnKey(named.classes, c.class)) {
        return {
          error: 'invalid_request',
          message: `class ${c.class} is not one of the classes of ${c.policy}`,
        };
      }
      const policy = withClass(named, c.class);
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
      if (kindOf(policy.kind).wholeUnits && !Number.isInteger(c.cost)) {
        return {
          error: 'invalid_request',
          message: `cost ${c.cost} of ${policy.kind} policy ${policy.name} is not whole`,
        };
      }
      checks.push(this.#router.route(policy, c.subject, c.cost, c.class, request.idempotencyKey));
    }
    try {
      const outcome = await this.decide(
        { checks, idempotencyKey: request.idempotencyKey, dryRun: request.dryRun, forwarded: true },
        requestId,
        request.budgetMs,
        request.deadlineAtMs,
      );
      return outcome.replayed ? { results: outcome.results, replayed: true } : { results: outcome.results };
    } catch (error) {
      if (error instanceof AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT) {
        return { error: 'idempotency_conflict', message: error.message };
      }
      if (error instanceof AgentErrors.AGT_ERR_OVERLOADED) {
        return { error: 'overloaded', message: error.message };
      }
      throw error;
    }
  }
}
