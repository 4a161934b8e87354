/**
 * The conservation protocol on NATS: the pure LeaseCoordinator (core/lease) fed by heartbeats, usage, acks and
 * goodbyes from agents, by policy changes from the policy store and by a round timer; its allocation records
 * and agent registry persisted in JetStream KV. Plugs into `startCoordinator` as its `EngineFactory`.
 */
import type { Msg, NatsConnection, Subscription } from '@nats-io/nats-core';
import type { z } from 'zod';
import { roundAmount } from '../../core/admin-numbers.js';
import { steadyClock } from '../../core/clock.js';
import type { AllocationSample, AllocationSummary, RegionSummary } from '../../core/wire/admin.js';
import { LeaseCoordinator } from '../../core/lease/lease-coordinator.js';
import type { LeaseSettingsInput } from '../../core/lease/settings.js';
import type { RebalanceSettingsInput } from '../../core/rebalance/settings.js';
import {
  Ack,
  agentIdTag,
  Bye,
  Heartbeat,
  protocolSender,
  protocolSubjects,
  UNRECORDABLE_SUBJECT,
  Usage,
} from '../../core/wire/protocol.js';
import type { KvGuard } from '../nats/kv-guard.js';
import type { EngineContext, EngineFactory, ProtocolService } from '../ports.js';
import { stepper } from '../start-steps.js';
import { AllocationInsight } from './allocation-insight.js';
import {
  AllocationWriter,
  DEFAULT_WRITE_CONCURRENCY,
  openAllocationBuckets,
  type AllocationBuckets,
} from './allocation-persistence.js';
import { DemandSnapshots } from './demand-persistence.js';
import { protocolMetrics, type ProtocolMetrics } from './protocol-metrics.js';
import { recordableUsage } from './report-subjects.js';

export { AGENT_BUCKET_OPTIONS, ALLOCATION_BUCKET_OPTIONS } from './allocation-persistence.js';

export interface ProtocolOptions {
  rebalance?: RebalanceSettingsInput;
  lease?: LeaseSettingsInput;
  /** Safe static shares by region (sum ≤ 1); default equal split. */
  safeShares?: Readonly<Record<string, number>> | undefined;
  /** Most KV writes in flight at once. Default DEFAULT_WRITE_CONCURRENCY (64). */
  writeConcurrency?: number;
  /** Write a policy's demand snapshot at most this often, ms (core/lease/demand-snapshot.ts; default 5000). */
  snapshotIntervalMs?: number;
}

type MessageKind = 'heartbeat' | 'usage' | 'ack' | 'bye';

/** The EngineFactory that runs the conservation protocol. */
export function protocolEngine(options: ProtocolOptions = {}): EngineFactory {
  return async (context) => ProtocolEngine.start(context, options);
}

class ProtocolEngine implements ProtocolService {
  readonly #context: EngineContext;
  readonly #engine: LeaseCoordinator;
  readonly #metrics: ProtocolMetrics;
  readonly #subscriptions: Subscription[] = [];
  readonly #insight: AllocationInsight;
  readonly #writer: AllocationWriter;
  readonly #snapshots: DemandSnapshots;
  #timer: NodeJS.Timeout | undefined;
  #unsubscribePolicies: (() => void) | undefined;
  #stopped = false;
  #warnedUnrecordable = false;

  private constructor(
    context: EngineContext,
    engine: LeaseCoordinator,
    buckets: AllocationBuckets,
    snapshots: DemandSnapshots,
    metrics: ProtocolMetrics,
    options: ProtocolOptions,
  ) {
    this.#context = context;
    this.#engine = engine;
    this.#snapshots = snapshots;
    this.#metrics = metrics;
    this.#insight = new AllocationInsight(context.config.regions, engine.settings.demandHalfLifeMs);
    this.#writer = new AllocationWriter({
      context,
      engine,
      buckets,
      insight: this.#insight,
      metrics,
      writeConcurrency: options.writeConcurrency ?? DEFAULT_WRITE_CONCURRENCY,
    });
  }

  static async start(context: EngineContext, options: ProtocolOptions): Promise<ProtocolEngine> {
    // A start that fails ends the snapshot bucket's background attempts to open (demand-persistence.ts) with it,
    // also when the bucket's step finishes after the failure.
    let failed = false;
    let snapshots: DemandSnapshots | undefined;
    const opened = (s: DemandSnapshots): void => {
      snapshots = s;
      if (failed) void s.close();
    };
    try {
      return await ProtocolEngine.#start(context, options, opened);
    } catch (error) {
      failed = true;
      await snapshots?.close();
      throw error;
    }
  }

  static async #start(
    context: EngineContext,
    options: ProtocolOptions,
    opened: (snapshots: DemandSnapshots) => void,
  ): Promise<ProtocolEngine> {
    const { nc, config, clock, log } = context;
    const step = stepper(context.steps);
    const metrics = protocolMetrics(context.registry);
    // Independent reads, side by side: the allocation and agent buckets, the demand snapshots (what the leader
    // before knew of demand, so rebalancing carries on from there: core/lease/demand-snapshot.ts; bounded, never
    // failing), and the policies.
    const [buckets, [snapshots, demandSnapshots], policies] = await Promise.all([
      openAllocationBuckets(context),
      (async () => {
        const snapshots = await step('demand_bucket', () => DemandSnapshots.open(context, metrics));
        opened(snapshots);
        return [snapshots, await step('demand_load', () => snapshots.load())] as const;
      })(),
      // Read when the store opened, just before: not read again (a write since would have dropped it).
      step('policies_list', async () => context.policies.takeOpened?.() ?? context.policies.list()),
    ]);
    const { records, registrations } = buckets;
    const engine = new LeaseCoordinator({
      coordinatorId: `coordinator-${process.pid}-${clock.now().toString(36)}`,
      regions: config.regions,
      // Agents' leases and grace periods are durations: a wall-clock step on this host must not end them early
      // (a share handed on while its agents may still decide with it) or late.
      clock: steadyClock(clock),
      rebalance: options.rebalance,
      lease: options.lease,
      safeShares: options.safeShares,
      records: records.map(({ value, revision }) => ({ record: value, revision })),
      agents: registrations.map(({ value }) => value),
      registryComplete: buckets.registrySkipped === 0,
      demandSnapshots,
      snapshotIntervalMs: options.snapshotIntervalMs,
    });
    snapshots.counted(engine.snapshotOutcomes);
    // Policies win over what was persisted: deleted ones lose their allocation, new ones get one.
    const known = new Set(policies.map((p) => p.policy.name));
    for (const name of engine.policyNames()) if (!known.has(name)) engine.removePolicy(name);
    for (const { policy } of policies) engine.upsertPolicy(policy);
    const self = new ProtocolEngine(context, engine, buckets, snapshots, metrics, options);
    for (const { value } of records) self.#insight.restored(value.policy, value.default.shares);
    for (const { key, raw, revision } of records) {
      self.#writer.guard.seed(key, raw, revision);
      self.#writer.known(key, revision);
    }
    // A leader stamps its epoch on every record before answering anyone: agents that see it refuse records and
    // renewals of older epochs, and the compare-and-set of an older coordinator's next write fails.
    if (context.leader !== undefined) for (const name of engine.policyNames()) engine.writeFailed(name);
    // Persist what restoring decided (budget restored after a restart) before answering anyone.
    await step('epoch_writes', () => self.#writer.flushNow());
    self.#unsubscribePolicies = context.policies.onChange((change) => {
      if (change.after === null) self.#insight.removed(change.name);
      if (change.after === null) engine.removePolicy(change.name);
      else engine.upsertPolicy(change.after);
      self.#writer.schedule();
    });
    self.#subscribe(nc);
    self.#writer.guard.start();
    self.#timer = setInterval(() => self.#round(), engine.settings.roundMs);
    self.#timer.unref();
    log.info(
      {
        regions: config.regions,
        policies: engine.policyCount,
        agents: registrations.length,
        learning: engine.learning(),
        demandSnapshots: Object.fromEntries(engine.snapshotOutcomes),
      },
      'protocol engine started',
    );
    return self;
  }

  // ---- ProtocolService port ------------------------------------------------------------------------------------

  allocations(): AllocationSummary[] {
    const now = this.#context.clock.now();
    const regions = this.#engine.regionViews();
    return this.#engine.allocations().map((view) => this.#insight.summary(view, regions, now));
  }

  history(policy: string): AllocationSample[] | undefined {
    return this.#insight.history(policy);
  }

  regions(): RegionSummary[] {
    return this.#engine.regionViews().map((r) => ({
      region: r.region,
      lastReportAt: r.lastReportAt === null ? null : new Date(r.lastReportAt).toISOString(),
      agents: r.agents.filter((a) => !a.lapsed).length,
      reportLagMs: r.lagMs,
      shedPerSecond: roundAmount(r.agents.reduce((sum, a) => sum + a.shedPerSecond, 0)),
      agentDetails: r.agents.map((a) => ({
        agentId: a.agentId,
        instance: a.instance,
        lastHeartbeatAt: a.lastHeartbeatAt === null ? null : new Date(a.lastHeartbeatAt).toISOString(),
        leaseUntil: a.leaseUntil === null ? null : new Date(a.leaseUntil).toISOString(),
        appliedRevision: a.appliedRevision,
        ackRevision: a.ackRevision,
        lapsed: a.lapsed,
        shedPerSecond: roundAmount(a.shedPerSecond),
      })),
    }));
  }

  reasons(): string[] {
    const error = this.#writer.lastError;
    return error === undefined ? [] : [`allocation writes failing: ${error}`];
  }

  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    clearInterval(this.#timer);
    this.#unsubscribePolicies?.();
    for (const sub of this.#subscriptions) sub.unsubscribe();
    await this.#writer.close();
    await this.#snapshots.close();
  }

  /** The guard of the allocations bucket, for tests and diagnostics. */
  get guard(): KvGuard {
    return this.#writer.guard;
  }

  /** The pure engine, for tests and diagnostics. */
  get engine(): LeaseCoordinator {
    return this.#engine;
  }

  // ---- messages -----------------------------------------------------------------------------------------------

  #subscribe(nc: NatsConnection): void {
    const subjects = protocolSubjects(this.#context.config.kvNamespace);
    const on = <T>(
      kind: MessageKind,
      subject: string,
      schema: z.ZodType<T>,
      handle: (value: T, msg: Msg, tag: string | undefined) => void,
    ) => {
      this.#subscriptions.push(
        nc.subscribe(subject, {
          callback: (error, msg) => {
            if (error !== null || this.#stopped) return;
            this.#metrics.messages.inc({ kind });
            const value = parse(msg, schema);
            if (value === undefined) {
              this.#metrics.dropped.inc({ kind, reason: 'invalid' });
              return;
            }
            // The region in the subject must be the region in the message: no agent speaks for another region.
            const sender = protocolSender(msg.subject);
            const said = value as { region?: string; agentId?: string };
            if (sender === undefined || said.region !== sender.region) {
              this.#metrics.dropped.inc({ kind, reason: 'region_mismatch' });
              return;
            }
            // The credential tag in the subject (the server lets each nkey publish under its own tag only) must
            // be the tag the agent id was made under: no agent speaks for another agent.
            if (sender.tag !== undefined && agentIdTag(said.agentId ?? '') !== sender.tag) {
              this.#metrics.dropped.inc({ kind, reason: 'agent_mismatch' });
              return;
            }
            handle(value, msg, sender.tag);
            this.#writer.schedule();
          },
        }),
      );
    };
    on('heartbeat', subjects.all.heartbeat, Heartbeat, (hb, msg, tag) => {
      const leader = this.#context.leader;
      if (leader !== undefined && !leader.isLeader()) {
        this.#metrics.dropped.inc({ kind: 'heartbeat', reason: 'not_leader' });
        return;
      }
      // Untagged: an agent from before credential tags (records are then written without newer fields).
      const reply = this.#engine.heartbeat(hb, tag, tag === undefined);
      const stamped =
        leader === undefined || 'refused' in reply ? reply : { ...reply, leaderEpoch: leader.epoch };
      if (msg.reply === undefined || msg.reply === '') return;
      const respond = () => msg.respond(JSON.stringify(stamped));
      // A renewal to an agent not yet in the registry waits for its registration to be written (the flush that
      // follows this message writes it first).
      if (!('refused' in reply) && this.#engine.awaitsRegistration(hb.agentId))
        this.#writer.afterRegistration(hb.agentId, respond);
      else respond();
    });
    on('usage', subjects.all.usage, Usage, (usage) => {
      const recordable = recordableUsage(usage);
      if (recordable.dropped > 0) this.#unrecordable(recordable.dropped, usage);
      // What operators read of a region (admitted and refused rates) comes from the reports that move demand only.
      if (this.#engine.usage(recordable.usage)) this.#insight.usage(usage, this.#context.clock.now());
    });
    on('ack', subjects.all.ack, Ack, (ack) => this.#engine.ack(ack));
    on('bye', subjects.all.bye, Bye, (bye) => this.#engine.bye(bye));
  }

  /**
   * Subjects of a report left out because no allocation record can hold them (report-subjects.ts): counted
   * every time, logged once per process (an agent reports them every interval while they are constrained).
   */
  #unrecordable(dropped: number, usage: Usage): void {
    this.#metrics.subjectsDropped.inc({ reason: 'not_a_record_key' }, dropped);
    if (this.#warnedUnrecordable) return;
    this.#warnedUnrecordable = true;
    this.#context.log.warn(
      { subject: UNRECORDABLE_SUBJECT, region: usage.region, agentId: usage.agentId },
      'protocol: a reported subject cannot be a key of an allocation record; it gets no override (logged once)',
    );
  }

  #round(): void {
    if (this.#stopped) return;
    const end = this.#metrics.roundSeconds.startTimer();
    this.#engine.tick();
    end();
    this.#metrics.rounds.inc();
    this.#metrics.learning.set(this.#engine.learning() ? 1 : 0);
    for (const [name, value] of Object.entries(this.#engine.counters) as [string, number][]) {
      this.#metrics.engine.set({ counter: name }, value);
    }
    const views = this.#engine.allocations();
    this.#insight.sample(views, this.#context.clock.now());
    for (const a of views) {
      for (const [region, share] of Object.entries(a.shares))
        this.#metrics.shares.set({ policy: a.policy, region }, share);
    }
    for (const r of this.#engine.regionViews()) {
      if (r.lagMs !== null) this.#metrics.reportLag.set({ region: r.region }, r.lagMs / 1000);
      const lapsed = r.agents.filter((a) => a.lapsed).length;
      this.#metrics.agents.set({ region: r.region, state: 'live' }, r.agents.length - lapsed);
      this.#metrics.agents.set({ region: r.region, state: 'lapsed' }, lapsed);
    }
    this.#writer.schedule();
    this.#snapshots.write(this.#engine.takeDemandSnapshots());
  }
}

function parse<T>(msg: Msg, schema: z.ZodType<T>): T | undefined {
  let value: unknown;
  try {
    value = msg.json();
  } catch {
    return undefined;
  }
  const parsed = schema.safeParse(value);
  return parsed.success ? parsed.data : undefined;
}
