/**
 * An agent's side of the conservation protocol on NATS: the pure AgentLease (core/lease) fed by a watch of the
 * allocation records (JetStream KV), by heartbeat replies, and by the clock; acknowledgements, usage and a
 * goodbye sent back. Its `lease` is the ShareView the decision path sizes buckets with.
 *
 * Recovery: the watch is rebuilt from a full reload after every reconnect (a watch's consumer may not survive
 * a server restart), and records deleted meanwhile are deleted here too. Heartbeats keep going whatever
 * happens; a missing reply just means no renewal, and the lease lapses safely on its own.
 */
import { defaultLeaseSettings } from '../../core/lease/settings.js';
import { randomBytes } from 'node:crypto';
import type { KvWatchEntry } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { Counter, Gauge, type Registry } from 'prom-client';
import { monotonicOf, type Clock } from '../../core/clock.js';
import { reportIntervalProblem } from '../../core/distance.js';
import { AgentLease } from '../../core/lease/agent-lease.js';
import type { RenewalBounds } from '../../core/lease/trust-checks.js';
import {
  DEFAULT_KV_NAMESPACE,
  DEFAULT_NATS_TIMEOUT_MS,
  kvNames,
  policyNameFromKey,
} from '../../core/wire/kv.js';
import {
  AllocationRecord,
  OPEN_CREDENTIAL_TAG,
  protocolSubjects,
  RenewalReply,
  type ProtocolSubjects,
} from '../../core/wire/protocol.js';
import { InitialLoadStalled, KvWatchLoop, type KvWatchSession } from '../../common/nats/kv-watch-loop.js';
import type { UsageRecorder } from '../reporting/usage-recorder.js';

export interface LeaseHolderOptions {
  nc: NatsConnection;
  region: string;
  /** Stable, unique name of this agent process (e.g. host:port); a restart under the same name replaces it. */
  instance: string;
  /**
   * The first heartbeat waits until this settles (default: sent at `start`). A heartbeat under the same `instance`
   * makes the coordinator forget this process's predecessor and settle its region's pending shrinks; terms the
   * predecessor gave may be in use until the instant it recorded in Redis, so the agent is known only once that
   * has passed (regional-agent/terms/terms-until.ts `predecessorTermsOver`).
   */
  firstHeartbeatAfter?: Promise<unknown>;
  clock: Clock;
  namespace?: string;
  /**
   * The tag of this agent's NATS credential (regional-agent/nats/credentials.ts `natsCredentialTag`): the last
   * token of the subjects it publishes on and the start of its id. Default `open` (a server without credentials).
   */
  credentialTag?: string;
  /** Counted usage to report each interval. */
  usage?: UsageRecorder;
  /** Margin for the offset between this clock and Redis time in refill floors, ms. Default: the lease settings'. */
  skewMs?: number;
  /** Heartbeats until the coordinator says otherwise, ms. Default: the lease settings'. */
  reportIntervalMs?: number;
  /**
   * Round trip to the farthest region this agent knows (`QP_ROUND_TRIPS`), ms: a coordinator's report interval
   * shorter than 1.25 of it is logged as a warning (core/distance.ts reportIntervalProblem). Default 0: none.
   */
  farthestRoundTripMs?: number;
  /** Deadline of one heartbeat request or KV call, ms. Default DEFAULT_NATS_TIMEOUT_MS (core/wire/kv.ts). */
  timeoutMs?: number;
  /** Serve safely (lapsed mode) when no renewal came this long after start. Default DEFAULT_STARTUP_WAIT_MS. */
  startupWaitMs?: number;
  /** What a renewal may ask at most; default `defaultRenewalBounds` (core/lease/trust-checks.ts). */
  renewalBounds?: RenewalBounds;
  registry?: Registry;
  log?: { warn(obj: object, msg?: string): void; info(obj: object, msg?: string): void };
}

interface HolderMetrics {
  heartbeats: Counter<'outcome'>;
  acks: Counter;
  reloads: Counter;
  watchFailures: Counter<'kind'>;
  badRecords: Counter;
  refusedRecords: Counter;
  staleRecords: Counter;
  mode: Gauge<'mode'>;
  appliedRevision: Gauge;
  share: Gauge<'policy'>;
}

/** Where the requests an agent shed are counted (its admission control). */
export interface ShedSource {
  takeShed(): number;
}

export class LeaseHolder {
  /** The shares this agent enforces. */
  readonly lease: AgentLease;
  readonly agentId: string;
  readonly #options: LeaseHolderOptions;
  readonly #subjects: ProtocolSubjects;
  readonly #bucket: string;
  readonly #metrics: HolderMetrics | undefined;
  #interval: number;
  #seq = 0;
  #shed: ShedSource | undefined;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  #loop: KvWatchLoop | undefined;
  #loaded = false;
  /** Highest coordinator epoch seen in a renewal or a record: anything older comes from a deposed coordinator. */
  #leaderEpoch = 0;
  /** The last report interval checked against the farthest link (warned about once each). */
  #checkedInterval: number | undefined;
  #firstLoad: (() => void) | undefined;

  constructor(options: LeaseHolderOptions) {
    this.#options = options;
    const tag = options.credentialTag ?? OPEN_CREDENTIAL_TAG;
    this.agentId = `${tag}_${randomBytes(9).toString('hex')}`;
    this.#subjects = protocolSubjects(options.namespace ?? DEFAULT_KV_NAMESPACE, tag);
    this.#bucket = kvNames(options.namespace ?? DEFAULT_KV_NAMESPACE).allocations;
    this.#interval = options.reportIntervalMs ?? defaultLeaseSettings.reportIntervalMs;
    this.lease = new AgentLease({
      region: options.region,
      clock: options.clock,
      skewMs: options.skewMs ?? defaultLeaseSettings.skewMs,
      startupWaitMs: options.startupWaitMs,
      renewalBounds: options.renewalBounds,
    });
    this.lease.onAck((ackRevision) => this.#publish(this.#subjects.ack(options.region), { ackRevision }));
    this.#metrics = options.registry === undefined ? undefined : holderMetrics(options.registry);
  }

  /** Start watching records and sending heartbeats. Resolves once the first full load of records is done. */
  async start(): Promise<void> {
    let loaded!: () => void;
    const first = new Promise<void>((resolve) => (loaded = resolve));
    this.#firstLoad = loaded;
    const timeoutMs = this.#options.timeoutMs ?? DEFAULT_NATS_TIMEOUT_MS;
    this.#loop = new KvWatchLoop({
      nc: this.#options.nc,
      bucket: this.#bucket,
      timeoutMs,
      retryMs: 250,
      maxRetryMs: 5000,
      session: () => this.#session(),
      onFailure: (error) => {
        this.#metrics?.watchFailures.inc({ kind: error instanceof InitialLoadStalled ? 'stalled' : 'error' });
        this.#options.log?.warn({ err: error, bucket: this.#bucket }, 'allocation watch failed; retrying');
      },
    });
    const after = this.#options.firstHeartbeatAfter;
    if (after === undefined) this.#beat();
    else {
      const beat = () => this.#beat();
      after.then(beat, beat);
    }
    await first;
  }

  /** Ready to decide (renewed, or serving safely after the startup wait with the coordinator unreachable). */
  ready(): boolean {
    return this.#loaded && this.lease.ready();
  }

  /** Why it is not ready, in words (empty when ready): the lease, the allocation records' first load, or both. */
  notReady(): string[] {
    return [
      ...(this.lease.ready() ? [] : ['no lease from the coordinator yet']),
      ...(this.#loaded
        ? []
        : [`allocation records not loaded yet (${this.#loop?.describe() ?? 'watch not started'})`]),
    ];
  }

  /** Say goodbye (the coordinator stops counting this agent) and stop. */
  async stop(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#timer);
    if (!this.#options.nc.isClosed()) {
      this.#publish(this.#subjects.bye(this.#options.region), {});
      await this.#options.nc.flush().catch(() => undefined);
    }
    await this.#loop?.close();
    this.#firstLoad?.();
  }

  // ---- heartbeats and usage -------------------------------------------------------------------------------

  #beat(): void {
    if (this.#closed) return;
    void this.#heartbeat().finally(() => {
      if (this.#closed) return;
      this.#timer = setTimeout(() => this.#beat(), this.#interval);
      this.#timer.unref();
    });
  }

  /** Report, in each heartbeat, the requests this agent's admission control shed since the previous one. */
  reportShedFrom(source: ShedSource): void {
    this.#shed = source;
  }

  async #heartbeat(): Promise<void> {
    const { nc, region, clock } = this.#options;
    const seq = this.#seq++;
    this.lease.poll();
    const sentAt = clock.now();
    // The lease is a duration: measured from when the heartbeat left on the monotonic clock.
    const sentAtMono = monotonicOf(clock);
    const heartbeat = {
      agentId: this.agentId,
      instance: this.#options.instance,
      region,
      seq,
      appliedRevision: this.lease.appliedRevision,
      ackRevision: this.lease.ackRevision,
      mode: this.lease.mode(),
      renewedSeq: this.lease.renewedSeq,
      ...(this.#shed === undefined ? {} : { shed: this.#shed.takeShed() }),
    };
    if (this.#options.usage !== undefined) {
      const usage = this.#options.usage.take(sentAt);
      usage.chunks.forEach((policies, chunk) =>
        this.#publish(this.#subjects.usage(region), {
          seq,
          intervalMs: usage.intervalMs,
          chunk,
          chunks: usage.chunks.length,
          policies,
          dropped: usage.dropped,
        }),
      );
    }
    if (nc.isClosed()) return;
    try {
      const msg = await nc.request(this.#subjects.heartbeat(region), JSON.stringify(heartbeat), {
        timeout: Math.min(this.#options.timeoutMs ?? DEFAULT_NATS_TIMEOUT_MS, Math.max(100, this.#interval)),
      });
      const parsed = RenewalReply.safeParse(msg.json());
      if (!parsed.success) {
        this.#metrics?.heartbeats.inc({ outcome: 'bad_reply' });
        return;
      }
      const reply = parsed.data;
      if ('refused' in reply) {
        this.lease.refused(reply.refused);
        this.#metrics?.heartbeats.inc({ outcome: 'refused' });
        this.#options.log?.warn({ reason: reply.refused }, 'lease renewal refused');
        return;
      }
      if (this.#staleEpoch(reply.leaderEpoch)) {
        // A coordinator that lost the leader lease (a zombie after a partition): its word renews nothing.
        this.#metrics?.heartbeats.inc({ outcome: 'stale_epoch' });
        this.#options.log?.warn(
          { epoch: reply.leaderEpoch ?? 0, seen: this.#leaderEpoch, coordinatorId: reply.coordinatorId },
          'heartbeat reply of an older coordinator epoch refused',
        );
        return;
      }
      const outcome = this.lease.renewed(reply, sentAtMono, seq);
      if (outcome === 'out_of_bounds') {
        // Not the coordinator's word, or not one to follow: the lease and interval stay as they were.
        this.#metrics?.heartbeats.inc({ outcome: 'out_of_bounds' });
        this.#options.log?.warn(
          { reason: this.lease.lastRenewalProblem, coordinatorId: reply.coordinatorId },
          'heartbeat reply refused: out of bounds',
        );
        return;
      }
      this.#warnIfTooShort(reply.reportIntervalMs);
      this.#interval = reply.reportIntervalMs;
      this.#metrics?.heartbeats.inc({ outcome: outcome === 'accepted' ? 'renewed' : 'stale_reply' });
    } catch {
      // No coordinator answered in time: no renewal; the lease lapses on its own if this goes on.
      this.#metrics?.heartbeats.inc({ outcome: 'no_reply' });
    } finally {
      const metrics = this.#metrics;
      if (metrics !== undefined) {
        metrics.mode.reset();
        metrics.mode.set({ mode: this.lease.mode() }, 1);
        // The policy's default share in force here (overridden subjects have their own).
        metrics.share.reset();
        for (const policy of this.lease.policies()) {
          const share = this.lease.shareFor(policy, '');
          if (share !== undefined) metrics.share.set({ policy }, share.share);
        }
      }
    }
  }

  /** The highest coordinator epoch seen so far (0: none). */
  get leaderEpoch(): number {
    return this.#leaderEpoch;
  }

  /** True for an epoch older than one already seen (absent counts as 0); otherwise remembers it. */
  /** Says so once per interval the coordinator sets when it cannot carry a renewal across the farthest link. */
  #warnIfTooShort(intervalMs: number): void {
    if (intervalMs === this.#checkedInterval) return;
    this.#checkedInterval = intervalMs;
    const problem = reportIntervalProblem(intervalMs, this.#options.farthestRoundTripMs ?? 0);
    if (problem !== undefined) this.#options.log?.warn({ reportIntervalMs: intervalMs }, problem);
  }

  #staleEpoch(epoch: number | undefined): boolean {
    const e = epoch ?? 0;
    if (e < this.#leaderEpoch) return true;
    this.#leaderEpoch = e;
    return false;
  }

  #publish(subject: string, body: object): void {
    const { nc, region } = this.#options;
    if (nc.isClosed() || nc.isDraining()) return;
    if (subject.includes('.v1.ack.')) this.#metrics?.acks.inc();
    nc.publish(subject, JSON.stringify({ agentId: this.agentId, region, ...body }));
  }

  // ---- allocation records -----------------------------------------------------------------------------------

  /** One load of the records: apply each, delete what disappeared meanwhile, then follow updates. */
  #session(): KvWatchSession {
    this.#metrics?.reloads.inc();
    const seen = new Set<string>();
    return {
      loaded: (lastRevision) => {
        // Records deleted while this agent was not watching.
        for (const policy of this.lease.policies()) {
          if (!seen.has(policy)) {
            this.lease.applyRecord(policy, null, Math.max(this.lease.appliedRevision, lastRevision));
          }
        }
        this.lease.recordsLoaded();
        this.#loaded = true;
        this.#firstLoad?.();
      },
      entry: (entry) => this.#apply(entry, seen),
    };
  }

  #apply(entry: KvWatchEntry, seen: Set<string>): void {
    const policy = policyNameFromKey(entry.key);
    if (policy === undefined) {
      this.#metrics?.badRecords.inc();
      return;
    }
    seen.add(policy);
    if (entry.operation !== 'PUT') {
      this.lease.applyRecord(policy, null, entry.revision);
    } else {
      let value: unknown;
      try {
        value = entry.json();
      } catch {
        value = undefined;
      }
      const parsed = AllocationRecord.safeParse(value);
      if (!parsed.success || parsed.data.policy !== policy) {
        // Never trusted: the policy keeps its last good record.
        this.#metrics?.badRecords.inc();
        return;
      }
      if (this.#staleEpoch(parsed.data.leaderEpoch)) {
        this.#metrics?.staleRecords.inc();
        this.#options.log?.warn(
          { policy, revision: entry.revision, epoch: parsed.data.leaderEpoch ?? 0, seen: this.#leaderEpoch },
          'allocation record of an older coordinator epoch refused; the last good record stays in force',
        );
        return;
      }
      const refused = this.lease.applyRecord(policy, parsed.data, entry.revision);
      if (refused !== undefined) {
        this.#metrics?.refusedRecords.inc();
        this.#options.log?.warn(
          { policy, revision: entry.revision, reason: refused },
          'allocation record refused; the last good record stays in force',
        );
        return;
      }
    }
    this.#metrics?.appliedRevision.set(this.lease.appliedRevision);
  }
}

function holderMetrics(registry: Registry): HolderMetrics {
  const registers = [registry];
  return {
    heartbeats: new Counter({
      name: 'quotaplane_agent_heartbeats_total',
      help: 'Heartbeats sent to the coordinator, by outcome (renewed, refused, no_reply, bad_reply, stale_reply: later than one report interval, ignored; out_of_bounds: a lease, grace or interval beyond the bounds, ignored; stale_epoch: from a coordinator of an older epoch, ignored).',
      labelNames: ['outcome'],
      registers,
    }),
    acks: new Counter({
      name: 'quotaplane_agent_acks_total',
      help: 'Acknowledgements of shrinks sent.',
      registers,
    }),
    reloads: new Counter({
      name: 'quotaplane_agent_allocation_loads_total',
      help: 'Full loads of the allocation records (the first, then one per recovery).',
      registers,
    }),
    watchFailures: new Counter({
      name: 'quotaplane_agent_allocation_watch_failures_total',
      help: 'Watches of the allocation records given up and started again, by kind (stalled: the first load stopped arriving before it completed; error: opening or following the watch failed).',
      labelNames: ['kind'],
      registers,
    }),
    badRecords: new Counter({
      name: 'quotaplane_agent_allocation_bad_records_total',
      help: 'Allocation records that failed validation and were ignored.',
      registers,
    }),
    staleRecords: new Counter({
      name: 'quotaplane_agent_allocation_stale_epoch_records_total',
      help: 'Allocation records of an older coordinator epoch (a coordinator that lost the leader lease), refused; the last good record stays in force.',
      registers,
    }),
    refusedRecords: new Counter({
      name: 'quotaplane_agent_allocation_refused_records_total',
      help: 'Allocation records refused because their shares in force sum above 1; the last good record stays in force.',
      registers,
    }),
    mode: new Gauge({
      name: 'quotaplane_agent_lease_mode',
      help: 'Lease state of this agent: 1 on the current mode (none, valid, lapsed, settled).',
      labelNames: ['mode'],
      registers,
    }),
    appliedRevision: new Gauge({
      name: 'quotaplane_agent_allocation_revision',
      help: 'Highest allocation record revision applied.',
      registers,
    }),
    share: new Gauge({
      name: 'quotaplane_agent_share_in_force',
      help: "Share of each regional policy's budget this agent enforces now (after lease state), by policy.",
      labelNames: ['policy'],
      registers,
    }),
  };
}
