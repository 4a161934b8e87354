/** What a finished decision leaves behind: counters, usage for the coordinator, remembered refusals, a log line. */
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { Clock } from '../../core/clock.js';
import { subjectFingerprint } from '../../core/subjects/subject.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { DecisionOutcome, PreparedRequest } from './prepared.js';
import type { RefusalMemory } from './refusal-memory.js';

/** Where decided checks are counted for usage reports (regional-agent/reporting/usage-recorder.ts). */
export interface UsageSink {
  /** `ratePerSecond`: the subject's own refill (its class's when it has one), what its demand is capped at. */
  record(
    policy: string,
    subject: string,
    cost: number,
    allowed: boolean,
    remainingFraction: number,
    ratePerSecond: number,
  ): void;
}

export interface DecisionRecorderDeps {
  metrics: AgentMetrics;
  log: Logger;
  clock: Clock;
  random: () => number;
  usage?: UsageSink | undefined;
  /** Where each (policy, subject)'s last refusal is kept for `GET /v1/explain`. */
  refusals?: RefusalMemory | undefined;
}

/** Reasons that name why a bucket was empty (a refusal for quota): not counted as degraded decisions. */
const QUOTA_REASONS: ReadonlySet<string> = new Set(['subject_exhausted', 'share_exhausted']);

/** Key of the log fingerprints: the HMAC secret when there is one, else a random key of this process. */
export function fingerprintKey(hmacSecret: string | undefined): string | Uint8Array {
  return hmacSecret ?? randomBytes(32);
}

/**
 * What a finished decision leaves behind: decision and degraded counters, the retry-after histogram, the usage
 * the coordinator rebalances on, the last refusal of each refused check's subject (for explanations), and a
 * sampled log line with a one-way subject fingerprint.
 */
export class DecisionRecorder {
  readonly #deps: DecisionRecorderDeps;
  readonly #region: string;
  readonly #logSampleRate: number;
  readonly #fingerprintKey: string | Uint8Array;

  constructor(
    deps: DecisionRecorderDeps,
    config: { region: string; logSampleRate: number; hmacSecret?: string | undefined },
  ) {
    this.#deps = deps;
    this.#region = config.region;
    this.#logSampleRate = config.logSampleRate;
    this.#fingerprintKey = fingerprintKey(config.hmacSecret);
  }

  /**
   * Remember the checks a charging decision refused (those that did not fit: the ones it was refused for). A dry
   * run, an explanation and a replayed answer refuse nothing new; a decision forwarded here from another region
   * is remembered there, by the region that answered the caller.
   */
  #noteRefusals(request: PreparedRequest, outcome: DecisionOutcome): void {
    const memory = this.#deps.refusals;
    if (memory === undefined || outcome.allowed || outcome.replayed) return;
    if (request.dryRun || request.forwarded === true) return;
    const at = new Date(this.#deps.clock.now()).toISOString();
    for (const { prepared: p, result: r, fits } of outcome.checks) {
      if (r === undefined || fits) continue;
      memory.note(p.policy.name, p.subject, {
        at,
        reason: r.reason ?? null,
        cost: p.cost,
        limit: Math.floor(r.limit),
        remaining: Math.floor(r.remaining),
        retryAfterMs: r.retryAfterMs,
      });
    }
  }

  record(request: PreparedRequest, outcome: DecisionOutcome, requestId: string, started: number): void {
    const { metrics, log, usage } = this.#deps;
    const region = this.#region;
    // Each check as it was decided: a check moved to its policy's shared bucket counts as that bucket's.
    for (const { prepared: p, result: r, fits } of outcome.checks) {
      if (r === undefined) continue;
      if (!request.dryRun) {
        metrics.countDecision(p.policy.name, outcome.allowed, p.policy.mode);
        metrics.countDecisionByKind(p.policy.kind, outcome.allowed);
      }
      // Demand the coordinator follows: regional policies decided by this region's store (not failure modes).
      if (
        usage !== undefined &&
        !request.dryRun &&
        p.policy.mode === 'regional' &&
        (p.route === 'store' || p.route === 'log' || p.route === 'day')
      ) {
        const left = !fits || r.limit <= 0 ? 0 : r.remaining / r.limit;
        // p.policy is the policy as the subject's class sees it: its refill is the subject's own rate.
        usage.record(p.policy.name, p.subject, p.cost, outcome.allowed, left, p.policy.refillPerSecond);
      }
      // `subject_exhausted` and `share_exhausted` say why a bucket was empty: an ordinary refusal, not degraded.
      if (r.reason !== undefined && !QUOTA_REASONS.has(r.reason))
        metrics.degraded.labels(p.policy.name, region, r.reason, r.cause ?? '').inc();
    }
    this.#noteRefusals(request, outcome);
    if (!outcome.allowed && outcome.retryAfterMs !== null && !request.dryRun) {
      // Labelled with the first check that did not fit (the first check when none is marked).
      const first = outcome.checks.find((c) => !c.fits) ?? outcome.checks[0];
      const policy = first?.prepared.policy.name ?? '';
      metrics.retryAfter.labels(policy, region).observe(outcome.retryAfterMs / 1000);
    }
    if (this.#deps.random() < this.#logSampleRate) {
      log.info(
        {
          reqId: requestId,
          policies: outcome.checks.map((c) => c.prepared.policy.name),
          subjects: outcome.checks.map((c) => subjectFingerprint(c.prepared.subject, this.#fingerprintKey)),
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
