/**
 * The conservation protocol on NATS: the pure CoordinatorEngine (core/lease) fed by heartbeats, usage, acks and
 * goodbyes from agents, by policy changes from the policy store and by a round timer; its allocation records
 * and agent registry persisted in JetStream KV. Plugs into `startCoordinator` as its `EngineFactory`.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import type { Msg, NatsConnection, Subscription } from '@nats-io/nats-core';
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { z } from 'zod';
import type { AllocationSummary, RegionSummary } from '../../core/admin-wire.js';
import { CoordinatorEngine as Engine, type RecordWrite } from '../../core/lease/coordinator-engine.js';
import type { LeaseSettingsInput } from '../../core/lease/settings.js';
import type { RebalanceSettingsInput } from '../../core/rebalance/settings.js';
import { policyKey, policyNameFromKey } from '../../core/wire/kv.js';
import {
  Ack,
  AgentRegistration,
  AllocationRecord,
  Bye,
  Heartbeat,
  protocolSubjects,
  Usage,
} from '../../core/wire/protocol.js';
import type { CoordinatorEngine, EngineContext, EngineFactory } from '../ports.js';

export interface ProtocolOptions {
  rebalance?: RebalanceSettingsInput;
  lease?: LeaseSettingsInput;
  /** Safe static shares by region (sum ≤ 1); default equal split. */
  safeShares?: Record<string, number>;
  /** Most KV writes in flight at once. Default 64. */
  writeConcurrency?: number;
}

/** Settings of the allocation and agent buckets (agents bind to the allocation bucket as it is). */
export const ALLOCATION_BUCKET_OPTIONS = {
  history: 1,
  maxValueSize: 64 * 1024,
  description: 'quotaplane allocation records (key: policy name with . as =)',
} as const;
export const AGENT_BUCKET_OPTIONS = {
  history: 1,
  description: 'quotaplane agents known to the coordinator',
} as const;

type MessageKind = 'heartbeat' | 'usage' | 'ack' | 'bye';

interface ProtocolMetrics {
  messages: Counter<'kind'>;
  dropped: Counter<'kind' | 'reason'>;
  writes: Counter<'outcome'>;
  writeSeconds: Histogram;
  rounds: Counter;
  roundSeconds: Histogram;
  shares: Gauge<'policy' | 'region'>;
  learning: Gauge;
  engine: Gauge<'counter'>;
  reportLag: Gauge<'region'>;
  agents: Gauge<'region' | 'state'>;
}

/** The EngineFactory that runs the conservation protocol. */
export function protocolEngine(options: ProtocolOptions = {}): EngineFactory {
  return async (context) => ProtocolEngine.start(context, options);
}

class ProtocolEngine implements CoordinatorEngine {
  readonly #context: EngineContext;
  readonly #engine: Engine;
  readonly #allocations: KV;
  readonly #agents: KV;
  readonly #metrics: ProtocolMetrics;
  readonly #subscriptions: Subscription[] = [];
  readonly #inFlight = new Set<string>();
  readonly #writeConcurrency: number;
  #writing: Promise<void> = Promise.resolve();
  #flushQueued = false;
  #timer: NodeJS.Timeout | undefined;
  #unsubscribePolicies: (() => void) | undefined;
  #stopped = false;
  #lastWriteError: string | undefined;

  private constructor(
    context: EngineContext,
    engine: Engine,
    allocations: KV,
    agents: KV,
    metrics: ProtocolMetrics,
    options: ProtocolOptions,
  ) {
    this.#context = context;
    this.#engine = engine;
    this.#allocations = allocations;
    this.#agents = agents;
    this.#metrics = metrics;
    this.#writeConcurrency = options.writeConcurrency ?? 64;
  }

  static async start(context: EngineContext, options: ProtocolOptions): Promise<ProtocolEngine> {
    const { nc, names, config, clock, log } = context;
    const js = jetstream(nc, { timeout: config.natsTimeoutMs });
    const kvm = new Kvm(js);
    const allocations = await kvm.create(names.allocations, ALLOCATION_BUCKET_OPTIONS);
    const agents = await kvm.create(names.agents, AGENT_BUCKET_OPTIONS);
    const records = (await loadAll(allocations, AllocationRecord, log)).filter(
      ({ key, value }) => policyNameFromKey(key) === value.policy,
    );
    const registrations = await loadAll(agents, AgentRegistration, log);
    const engine = new Engine({
      coordinatorId: `coordinator-${process.pid}-${clock.now().toString(36)}`,
      regions: config.regions,
      clock,
      rebalance: options.rebalance,
      lease: options.lease,
      safeShares: options.safeShares,
      records: records.map(({ value, revision }) => ({ record: value, revision })),
      agents: registrations.map(({ value }) => value),
    });
    // Policies win over what was persisted: deleted ones lose their allocation, new ones get one.
    const policies = await context.policies.list();
    const known = new Set(policies.map((p) => p.policy.name));
    for (const name of engine.policyNames()) if (!known.has(name)) engine.removePolicy(name);
    for (const { policy } of policies) engine.upsertPolicy(policy);
    const self = new ProtocolEngine(
      context,
      engine,
      allocations,
      agents,
      protocolMetrics(context.registry),
      options,
    );
    // Persist what restoring decided (budget restored after a restart) before answering anyone.
    await self.#flushNow();
    self.#unsubscribePolicies = context.policies.onChange((change) => {
      if (change.after === null) engine.removePolicy(change.name);
      else engine.upsertPolicy(change.after);
      self.#scheduleFlush();
    });
    self.#subscribe(nc);
    self.#timer = setInterval(() => self.#round(), engine.settings.roundMs);
    self.#timer.unref();
    log.info(
      {
        regions: config.regions,
        policies: engine.policyCount,
        agents: registrations.length,
        learning: engine.learning(),
      },
      'protocol engine started',
    );
    return self;
  }

  // ---- CoordinatorEngine port ---------------------------------------------------------------------------------

  allocations(): AllocationSummary[] {
    const iso = (ms: number) => new Date(ms).toISOString();
    return this.#engine.allocations().map((a) => ({
      policy: a.policy,
      version: a.version,
      epoch: a.epoch,
      shares: a.shares,
      leases: Object.fromEntries(
        Object.entries(a.leases).map(([region, l]) => [
          region,
          { expiresAt: l.expiresAt === null ? null : iso(l.expiresAt), acked: l.acked },
        ]),
      ),
      overrides: a.overrides.map((o) => ({
        subject: o.subject,
        shares: o.shares,
        epoch: o.epoch,
        expiresAt: o.expiresAt === null ? null : iso(o.expiresAt),
      })),
    }));
  }

  regions(): RegionSummary[] {
    return this.#engine.regionViews().map((r) => ({
      region: r.region,
      lastReportAt: r.lastReportAt === null ? null : new Date(r.lastReportAt).toISOString(),
      agents: r.agents.filter((a) => !a.lapsed).length,
      reportLagMs: r.lagMs,
      agentDetails: r.agents.map((a) => ({
        agentId: a.agentId,
        instance: a.instance,
        lastHeartbeatAt: a.lastHeartbeatAt === null ? null : new Date(a.lastHeartbeatAt).toISOString(),
        leaseUntil: a.leaseUntil === null ? null : new Date(a.leaseUntil).toISOString(),
        appliedRevision: a.appliedRevision,
        ackRevision: a.ackRevision,
        lapsed: a.lapsed,
      })),
    }));
  }

  reasons(): string[] {
    return this.#lastWriteError === undefined ? [] : [`allocation writes failing: ${this.#lastWriteError}`];
  }

  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    clearInterval(this.#timer);
    this.#unsubscribePolicies?.();
    for (const sub of this.#subscriptions) sub.unsubscribe();
    await this.#writing;
  }

  /** The pure engine, for tests and diagnostics. */
  get engine(): Engine {
    return this.#engine;
  }

  // ---- messages -----------------------------------------------------------------------------------------------

  #subscribe(nc: NatsConnection): void {
    const subjects = protocolSubjects(this.#context.config.kvNamespace);
    const on = <T>(
      kind: MessageKind,
      subject: string,
      schema: z.ZodType<T>,
      handle: (value: T, msg: Msg) => void,
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
            const region = msg.subject.slice(msg.subject.lastIndexOf('.') + 1);
            if ((value as { region?: string }).region !== region) {
              this.#metrics.dropped.inc({ kind, reason: 'region_mismatch' });
              return;
            }
            handle(value, msg);
            this.#scheduleFlush();
          },
        }),
      );
    };
    on('heartbeat', subjects.all.heartbeat, Heartbeat, (hb, msg) => {
      const reply = this.#engine.heartbeat(hb);
      if (msg.reply !== undefined && msg.reply !== '') msg.respond(JSON.stringify(reply));
    });
    on('usage', subjects.all.usage, Usage, (usage) => this.#engine.usage(usage));
    on('ack', subjects.all.ack, Ack, (ack) => this.#engine.ack(ack));
    on('bye', subjects.all.bye, Bye, (bye) => this.#engine.bye(bye));
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
    for (const a of this.#engine.allocations()) {
      for (const [region, share] of Object.entries(a.shares))
        this.#metrics.shares.set({ policy: a.policy, region }, share);
    }
    for (const r of this.#engine.regionViews()) {
      if (r.lagMs !== null) this.#metrics.reportLag.set({ region: r.region }, r.lagMs / 1000);
      const lapsed = r.agents.filter((a) => a.lapsed).length;
      this.#metrics.agents.set({ region: r.region, state: 'live' }, r.agents.length - lapsed);
      this.#metrics.agents.set({ region: r.region, state: 'lapsed' }, lapsed);
    }
    this.#scheduleFlush();
  }

  // ---- persistence --------------------------------------------------------------------------------------------

  #scheduleFlush(): void {
    if (this.#flushQueued) return;
    this.#flushQueued = true;
    queueMicrotask(() => {
      this.#flushQueued = false;
      this.#writing = this.#writing.then(() => this.#flushNow());
    });
  }

  /** Persist every record and registration the engine asked for, one write per policy in flight at a time. */
  async #flushNow(): Promise<void> {
    const registry = this.#engine.takeRegistryWrites();
    for (const change of registry) {
      try {
        if ('put' in change) await this.#agents.put(change.put.agentId, JSON.stringify(change.put));
        else await this.#agents.delete(change.delete);
      } catch (error) {
        this.#context.log.warn({ err: error }, 'protocol: agent registry write failed');
      }
    }
    const writes = this.#engine.takeWrites();
    for (let at = 0; at < writes.length; at += this.#writeConcurrency) {
      await Promise.all(writes.slice(at, at + this.#writeConcurrency).map((w) => this.#write(w)));
    }
  }

  async #write(write: RecordWrite): Promise<void> {
    const key = policyKey(write.policy);
    const end = this.#metrics.writeSeconds.startTimer();
    try {
      if (write.record === null) {
        await this.#allocations.delete(key);
      } else {
        const revision = await this.#allocations.put(key, JSON.stringify(write.record));
        this.#engine.written(write.policy, write.seq, revision);
      }
      this.#metrics.writes.inc({ outcome: 'ok' });
      this.#lastWriteError = undefined;
    } catch (error) {
      // The engine keeps counting the old shares until the write lands; retry on the next flush.
      this.#engine.writeFailed(write.policy);
      this.#metrics.writes.inc({ outcome: 'error' });
      this.#lastWriteError = error instanceof Error ? error.message : String(error);
      this.#context.log.warn(
        { err: error, policy: write.policy },
        'protocol: allocation write failed; will retry',
      );
    } finally {
      end();
    }
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

/** Every entry of a bucket that parses, with its revision; bad ones are logged and skipped. */
async function loadAll<T>(
  kv: KV,
  schema: z.ZodType<T>,
  log: EngineContext['log'],
): Promise<{ key: string; value: T; revision: number }[]> {
  const out: { key: string; value: T; revision: number }[] = [];
  const keys = await kv.keys();
  const all: string[] = [];
  for await (const key of keys) all.push(key);
  for (const key of all) {
    const entry = await kv.get(key);
    if (entry === null || entry.operation !== 'PUT') continue;
    let value: unknown;
    try {
      value = entry.json();
    } catch {
      log.warn({ key }, 'protocol: skipped an unreadable KV entry');
      continue;
    }
    const parsed = schema.safeParse(value);
    if (!parsed.success) {
      log.warn({ key }, 'protocol: skipped an invalid KV entry');
      continue;
    }
    out.push({ key, value: parsed.data, revision: entry.revision });
  }
  return out;
}

function protocolMetrics(registry: Registry): ProtocolMetrics {
  const registers = [registry];
  return {
    messages: new Counter({
      name: 'quotaplane_protocol_messages_total',
      help: 'Protocol messages received from agents, by kind.',
      labelNames: ['kind'],
      registers,
    }),
    dropped: new Counter({
      name: 'quotaplane_protocol_messages_dropped_total',
      help: 'Protocol messages dropped (invalid, region mismatch), by kind and reason.',
      labelNames: ['kind', 'reason'],
      registers,
    }),
    writes: new Counter({
      name: 'quotaplane_allocation_writes_total',
      help: 'Allocation record writes to JetStream KV, by outcome.',
      labelNames: ['outcome'],
      registers,
    }),
    writeSeconds: new Histogram({
      name: 'quotaplane_allocation_write_seconds',
      help: 'Latency of allocation record writes.',
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
      registers,
    }),
    rounds: new Counter({
      name: 'quotaplane_rebalance_rounds_total',
      help: 'Rebalance rounds run.',
      registers,
    }),
    roundSeconds: new Histogram({
      name: 'quotaplane_rebalance_round_seconds',
      help: 'CPU-bound duration of one rebalance round.',
      buckets: [0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25],
      registers,
    }),
    shares: new Gauge({
      name: 'quotaplane_shares_issued',
      help: 'Share of each policy issued to each region (default vector).',
      labelNames: ['policy', 'region'],
      registers,
    }),
    learning: new Gauge({
      name: 'quotaplane_coordinator_learning',
      help: '1 while the coordinator is in learning mode after a start (it grows no share).',
      registers,
    }),
    reportLag: new Gauge({
      name: 'quotaplane_region_report_lag_seconds',
      help: 'Age of the last heartbeat or usage report from each region.',
      labelNames: ['region'],
      registers,
    }),
    agents: new Gauge({
      name: 'quotaplane_region_agents',
      help: 'Agents the coordinator knows per region: live, or lapsed (counted at their safe share).',
      labelNames: ['region', 'state'],
      registers,
    }),
    engine: new Gauge({
      name: 'quotaplane_protocol_engine_counter',
      help: 'Cumulative protocol engine counters (shrinks, grows, safety shrinks, overrides, refusals…).',
      labelNames: ['counter'],
      registers,
    }),
  };
}
