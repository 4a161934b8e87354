/**
 * One regional agent of the `dynamic` strategy: core's AgentLease (its ShareView, lease and acknowledgement
 * watermark), the usage it reports, and its decisions against its region's simulated Redis. It knows nothing of
 * the network: the control plane (control-plane.ts) carries its messages.
 */
import { AgentLease } from '../../core/lease/agent-lease.js';
import { isLogKind, type Policy } from '../../core/policy/policy.js';
import type { RegionalShare } from '../../core/shares/shares.js';
import type { EncodedCheck } from '../../core/models/token-bucket.js';
import type { Heartbeat, Usage } from '../../core/wire/protocol.js';
import type { RegionStore } from '../engine/region-store.js';
import type { Outcome, SimRequest } from '../strategy.js';
import { PolicyUsageCounter } from '../../core/shares/usage-accounting.js';
import { ShareSizing } from '../engine/bucket-sizing.js';
import { decideLog } from '../engine/log-decision.js';
import { SubjectPolicies } from '../engine/subject-classes.js';
import { subjectName } from './subject-name.js';
import type { VirtualClock } from './virtual-clock.js';

/** What a decision left in its bucket, as a fraction of its capacity (both micro-tokens), as the agent reports it. */
export function remainingFraction(remaining: number, capacity: number): number {
  return capacity > 0 ? remaining / capacity : 0;
}

/** One decision on the region's store, before it is counted. */
export interface Evaluation {
  outcome: Outcome;
  /** What the bucket kept after the decision, as a fraction of its capacity. */
  remainingFraction: number;
  /** The bucket decided on (undefined without a lease): its check and what it held after the decision. */
  bucket?: { check: EncodedCheck; remaining: number } | undefined;
  /** True when the bucket lacked tokens but could take the cost once refilled: a borrow may cover it. */
  short: boolean;
}

/** Retry-After of a decision without a lease (the agent fails closed), ms. */
export const NO_LEASE_RETRY_MS = 1000;

export interface SimAgentOptions {
  /** Index of the agent within its region (0, 1, …). */
  ordinal: number;
  region: number;
  regionName: string;
  policy: Policy;
  clock: VirtualClock;
  skewMs: number;
  graceMs: number;
  reportIntervalMs: number;
  /**
   * When its previous report went (ms of the clock, may be before the run): the deployment was running before
   * virtual time 0, so the first report covers a whole interval like every other.
   */
  previousReportAt: number;
  /**
   * Log kinds: size a region's limit by the lowest share of the window (`lowest`, the agent's rule, default) or
   * by the current share alone (`current`: what the rule buys, measured; no agent does this).
   */
  logShare?: 'lowest' | 'current' | undefined;
}

export class SimAgent {
  readonly id: string;
  readonly instance: string;
  readonly region: number;
  readonly regionName: string;
  readonly lease: AgentLease;
  /** Heartbeat interval the coordinator asked for, ms. */
  reportIntervalMs: number;
  /** Grace period of the last renewal, ms. */
  graceMs: number;
  /** Lease end the expiry timers were set for (ms of the clock). */
  armedUntil = 0;
  readonly #meter = new PolicyUsageCounter();
  readonly #sizing: ShareSizing;
  readonly #policy: Policy;
  readonly #policies: SubjectPolicies;
  readonly #clock: VirtualClock;
  #seq = 0;
  #lastReportAt: number;
  readonly #logShare: 'lowest' | 'current';

  constructor(o: SimAgentOptions) {
    this.region = o.region;
    this.regionName = o.regionName;
    this.instance = `${o.regionName}-${o.ordinal + 1}`;
    this.id = `agent-${this.instance}`;
    this.#policy = o.policy;
    this.#policies = new SubjectPolicies(o.policy);
    this.#clock = o.clock;
    this.reportIntervalMs = o.reportIntervalMs;
    this.graceMs = o.graceMs;
    this.lease = new AgentLease({
      region: o.regionName,
      clock: o.clock,
      skewMs: o.skewMs,
      graceMs: o.graceMs,
    });
    this.#sizing = new ShareSizing(o.policy, (ms) => o.clock.toStoreUs(ms));
    this.#lastReportAt = o.previousReportAt;
    this.#logShare = o.logShare ?? 'lowest';
  }

  /** The next heartbeat (its lease state and acknowledgement watermark as of now). */
  heartbeat(): Heartbeat {
    return {
      agentId: this.id,
      instance: this.instance,
      region: this.regionName,
      seq: ++this.#seq,
      appliedRevision: this.lease.appliedRevision,
      ackRevision: this.lease.ackRevision,
      mode: this.lease.mode(),
      renewedSeq: this.lease.renewedSeq,
    };
  }

  /** The usage since the last report, from the decisions this agent made. */
  usage(): Usage {
    const now = this.#clock.now();
    const intervalMs = Math.max(1, Math.round(now - this.#lastReportAt));
    this.#lastReportAt = now;
    return {
      agentId: this.id,
      region: this.regionName,
      seq: this.#seq,
      intervalMs,
      chunk: 0,
      chunks: 1,
      policies: [
        this.#meter.take(
          this.#policy.name,
          intervalMs,
          this.#policy.refillPerSecond,
          this.lease.watched(this.#policy.name),
        ),
      ],
      dropped: 0,
    };
  }

  /** The share this agent's lease gives `subject` now (undefined: no lease, the policy fails closed). */
  shareFor(subject: number): RegionalShare | undefined {
    return this.lease.shareFor(this.#policy.name, subjectName(subject));
  }

  /**
   * Decide `request` on the region's store with the share the lease gives its subject, inside enter()/done() as
   * the agent's decision service does; without a lease the policy fails closed (`no_lease`), as the agent does.
   * The decision is not counted in the usage report: `record` does that, once per request.
   */
  evaluate(request: SimRequest, store: RegionStore, now: number): Evaluation {
    const share = this.shareFor(request.subject);
    if (share === undefined) {
      return {
        outcome: { allowed: false, retryAfterMs: NO_LEASE_RETRY_MS, decidedAt: now, reason: 'no_lease' },
        remainingFraction: 0,
        short: false,
      };
    }
    if (isLogKind(this.#policy.kind)) {
      const done = this.lease.enter(this.#policy.name);
      const sized = this.#logShare === 'current' ? share.share : share;
      const log = decideLog(this.#policy, store, request.subject, request.cost, sized, now);
      done();
      return {
        outcome: log.outcome,
        remainingFraction: remainingFraction(log.remaining, log.limit),
        short: false,
      };
    }
    const done = this.lease.enter(this.#policy.name);
    const check = this.#sizing.check(share, request.cost, request.subject);
    const result = store.decide(request.subject, check, now);
    done();
    return {
      outcome: { allowed: result.allowed, retryAfterMs: result.retryAfterMs, decidedAt: now },
      remainingFraction: remainingFraction(result.remaining, check.capacity),
      bucket: { check, remaining: result.remaining },
      short: !result.allowed && result.retryAfterMs > 0,
    };
  }

  /** Count one request's final decision in the usage report, as the agent's recorder does. */
  record(request: SimRequest, allowed: boolean, remainingFraction: number): void {
    // With the subject's own rate (its class's when it has one), as the agent's decision recorder passes it.
    this.#meter.record(
      subjectName(request.subject),
      request.cost,
      allowed,
      remainingFraction,
      this.#policies.of(request.subject).refillPerSecond,
    );
  }

  /** Count tokens borrowed from other regions and credited here, as the agent's borrower does. */
  imported(tokens: number): void {
    this.#meter.imported(tokens);
  }

  /** Decide and count `request` at its arrival (no borrowing). */
  decide(request: SimRequest, store: RegionStore): Outcome {
    const evaluation = this.evaluate(request, store, request.at);
    this.record(request, evaluation.outcome.allowed, evaluation.remainingFraction);
    return evaluation.outcome;
  }
}
