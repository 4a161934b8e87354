/**
 * One regional agent of the `dynamic` strategy: core's AgentLease (its ShareView, lease and acknowledgement
 * watermark), the usage it reports, and its decisions against its region's simulated Redis. It knows nothing of
 * the network: the control plane (control-plane.ts) carries its messages.
 */
import { AgentLease } from '../../core/lease/agent-lease.js';
import type { Policy } from '../../core/policy.js';
import type { Heartbeat, Usage } from '../../core/wire/protocol.js';
import type { RegionStore } from '../engine/region-store.js';
import type { Outcome, SimRequest } from '../strategy.js';
import { ShareSizing } from './share-sizing.js';
import { subjectName, UsageMeter } from './usage-meter.js';
import type { VirtualClock } from './virtual-clock.js';

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
  readonly #meter = new UsageMeter();
  readonly #sizing: ShareSizing;
  readonly #policy: Policy;
  readonly #clock: VirtualClock;
  #seq = 0;
  #lastReportAt: number;

  constructor(o: SimAgentOptions) {
    this.region = o.region;
    this.regionName = o.regionName;
    this.instance = `${o.regionName}-${o.ordinal + 1}`;
    this.id = `agent-${this.instance}`;
    this.#policy = o.policy;
    this.#clock = o.clock;
    this.reportIntervalMs = o.reportIntervalMs;
    this.graceMs = o.graceMs;
    this.lease = new AgentLease({
      region: o.regionName,
      clock: o.clock,
      skewMs: o.skewMs,
      graceMs: o.graceMs,
    });
    this.#sizing = new ShareSizing(o.policy, o.clock);
    this.#lastReportAt = o.previousReportAt;
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
      policies: [this.#meter.take(this.#policy.name, this.lease.watched(this.#policy.name))],
      dropped: 0,
    };
  }

  /**
   * Decide `request` on the region's store with the share the lease gives its subject, inside enter()/done() as
   * the agent's decision service does; without a lease the policy fails closed (`no_lease`), as the agent does.
   */
  decide(request: SimRequest, store: RegionStore): Outcome {
    const share = this.lease.shareFor(this.#policy.name, subjectName(request.subject));
    if (share === undefined)
      return { allowed: false, retryAfterMs: NO_LEASE_RETRY_MS, decidedAt: request.at, reason: 'no_lease' };
    const done = this.lease.enter(this.#policy.name);
    const check = this.#sizing.check(share, request.cost);
    const result = store.decide(request.subject, check, request.at);
    done();
    this.#meter.record(request.subject, request.cost, result.allowed, result.remaining, check.capacity);
    return { allowed: result.allowed, retryAfterMs: result.retryAfterMs, decidedAt: request.at };
  }
}
