/**
 * The protocol engine's JetStream KV side: the allocation and agent buckets loaded at start, the allocation
 * records and agent registrations the lease coordinator asks for written back (a bounded number in flight), the
 * guard that undoes foreign writes to the allocation bucket, and the audit record of every written share move.
 */
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm, type KV, type KvEntry, type KvOptions } from '@nats-io/kv';
import type { z } from 'zod';
import type { AuditRecord } from '../../core/wire/admin.js';
import type { AllocationView } from '../../core/lease/allocation-views.js';
import type { LeaseCoordinator, RecordWrite } from '../../core/lease/lease-coordinator.js';
import { policyKey, policyNameFromKey } from '../../core/wire/kv.js';
import { AgentRegistration, AllocationRecord } from '../../core/wire/protocol.js';
import { KvGuard } from '../nats/kv-guard.js';
import { openAndRead } from '../nats/kv-read.js';
import type { EngineContext } from '../ports.js';
import { stepper } from '../start-steps.js';
import type { AllocationInsight } from './allocation-insight.js';
import type { WriteMetrics } from './protocol-metrics.js';

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

/** Most KV writes in flight at once, by default. */
export const DEFAULT_WRITE_CONCURRENCY = 64;

interface Loaded<T> {
  key: string;
  value: T;
  raw: string;
  revision: number;
}

export interface AllocationBuckets {
  allocations: KV;
  agents: KV;
  /** Allocation records whose key names their policy. */
  records: Loaded<AllocationRecord>[];
  registrations: Loaded<AgentRegistration>[];
  /** Registry entries skipped as unreadable or invalid: a successor then learns for a whole lease. */
  registrySkipped: number;
}

/**
 * Create (or bind to) both buckets and read what they hold, the two side by side. Each call is a step of the
 * start (coordinator/start-steps.ts). No call goes through JetStream's meta leader once the buckets exist: they are
 * opened without an account check, and read without a consumer (coordinator/nats/kv-read.ts).
 */
export async function openAllocationBuckets(context: EngineContext): Promise<AllocationBuckets> {
  const { nc, names, config, log } = context;
  const step = stepper(context.steps);
  const kvm = new Kvm(jetstream(nc, { timeout: config.natsTimeoutMs, checkAPI: false }));
  const jsm = await jetstreamManager(nc, { timeout: config.natsTimeoutMs, checkAPI: false });
  const replicas = config.replicas ?? 1;
  const open = async <T>(
    what: string,
    bucket: string,
    options: Partial<KvOptions>,
    schema: z.ZodType<T>,
  ): Promise<{ kv: KV; loaded: Loaded<T>[]; skipped: number }> => {
    // Read through the stream's leader: a direct get may be answered by any replica, and one still catching up
    // after the election would hand a new leader records and registrations older than those the agents hold.
    const { kv, entries } = await openAndRead({
      kvm,
      jsm,
      bucket,
      settings: { ...options, replicas },
      what,
      step,
    });
    return { kv, ...parseAll({ entries, schema, log }) };
  };
  const [allocations, agents] = await Promise.all([
    open('allocations', names.allocations, ALLOCATION_BUCKET_OPTIONS, AllocationRecord),
    open('agents', names.agents, AGENT_BUCKET_OPTIONS, AgentRegistration),
  ]);
  const records = allocations.loaded.filter(({ key, value }) => policyNameFromKey(key) === value.policy);
  return {
    allocations: allocations.kv,
    agents: agents.kv,
    records,
    registrations: agents.loaded,
    registrySkipped: agents.skipped,
  };
}

export interface AllocationWriterOptions {
  context: EngineContext;
  engine: LeaseCoordinator;
  buckets: Pick<AllocationBuckets, 'allocations' | 'agents'>;
  insight: AllocationInsight;
  metrics: WriteMetrics;
  writeConcurrency: number;
}

/** Writes what the lease coordinator asks for, one flush at a time; retries a failed record on the next. */
export class AllocationWriter {
  readonly #context: EngineContext;
  readonly #engine: LeaseCoordinator;
  readonly #allocations: KV;
  readonly #agents: KV;
  readonly #insight: AllocationInsight;
  readonly #metrics: WriteMetrics;
  readonly #writeConcurrency: number;
  /** The guard of the allocations bucket. */
  readonly guard: KvGuard;
  /** Revision of each allocation key as this writer last knew it, for compare-and-set writes (with a leader). */
  readonly #revisions = new Map<string, number>();
  /** Renewals waiting for their agent's registration to be written, by agent id. */
  readonly #heldRenewals = new Map<string, (() => void)[]>();
  #writing: Promise<void> = Promise.resolve();
  #flushQueued = false;
  #lastWriteError: string | undefined;
  /** Policies whose record was last refused as unreadable (#readable), logged once each. */
  readonly #unreadable = new Set<string>();

  constructor(options: AllocationWriterOptions) {
    const { context } = options;
    this.#context = context;
    this.#engine = options.engine;
    this.#allocations = options.buckets.allocations;
    this.#agents = options.buckets.agents;
    this.#insight = options.insight;
    this.#metrics = options.metrics;
    this.#writeConcurrency = options.writeConcurrency;
    this.guard = new KvGuard({
      nc: context.nc,
      bucket: context.names.allocations,
      timeoutMs: context.config.natsTimeoutMs,
      registry: context.registry,
      log: context.log,
      clock: context.clock,
      audit: context.audit,
      // The record in force is the engine's, not the last one written: write it again (or delete a key the
      // engine has no policy for).
      restore: async (key) => {
        const policy = policyNameFromKey(key);
        if (policy === undefined) {
          await this.#allocations.delete(key);
          return;
        }
        this.#engine.writeFailed(policy);
        this.schedule();
        // The flush is chained in a microtask: wait for it to be, then for it.
        await new Promise<void>((resolve) => queueMicrotask(resolve));
        await this.#writing;
      },
    });
  }

  /** Why writes fail, while the last one failed. */
  get lastError(): string | undefined {
    return this.#lastWriteError;
  }

  /** Flush once the current task is done (many changes in one task make one flush). */
  schedule(): void {
    if (this.#flushQueued) return;
    this.#flushQueued = true;
    queueMicrotask(() => {
      this.#flushQueued = false;
      this.#writing = this.#writing.then(() => this.flushNow());
    });
  }

  /**
   * Send a renewal once its agent's registration is written (core/lease: a renewal waits for it, so a successor's
   * registry names every agent that may hold a lease); dropped if the write fails.
   */
  afterRegistration(agentId: string, send: () => void): void {
    const held = this.#heldRenewals.get(agentId);
    if (held === undefined) this.#heldRenewals.set(agentId, [send]);
    else held.push(send);
  }

  /** Stop guarding and wait for the writes under way. */
  async close(): Promise<void> {
    await this.guard.close();
    await this.#writing;
  }

  /** The revision a key held when loaded: compare-and-set writes start from it. */
  known(key: string, revision: number): void {
    this.#revisions.set(key, revision);
  }

  /** Persist every record and registration the engine asked for, one write per policy in flight at a time. */
  async flushNow(): Promise<void> {
    const leader = this.#context.leader;
    // A coordinator that does not lead writes nothing (its records would be refused anyway).
    if (leader !== undefined && !leader.isLeader()) return;
    const registry = this.#engine.takeRegistryWrites();
    for (const change of registry) {
      const agentId = 'put' in change ? change.put.agentId : undefined;
      try {
        if ('put' in change) await this.#agents.put(change.put.agentId, JSON.stringify(change.put));
        else await this.#agents.delete(change.delete);
      } catch (error) {
        this.#context.log.warn({ err: error }, 'protocol: agent registry write failed');
        if (agentId === undefined) continue;
        // Its held renewals are dropped (the agent asks again next interval); the write is retried.
        this.#heldRenewals.delete(agentId);
        this.#engine.registrationFailed(agentId);
        continue;
      }
      if (agentId === undefined) continue;
      this.#engine.registered(agentId);
      const held = this.#heldRenewals.get(agentId) ?? [];
      this.#heldRenewals.delete(agentId);
      // Not once the lease is lost during the write: a successor may have read the registry without this agent,
      // and a renewal sent now would be a lease it does not know to wait for. The agent asks again.
      if (leader !== undefined && !leader.isLeader()) continue;
      for (const send of held) send();
    }
    const writes = this.#engine.takeWrites();
    if (writes.length === 0) return;
    // Views taken with the writes: the demand and epoch a move is recorded with.
    const views = new Map(this.#engine.allocations().map((v) => [v.policy, v]));
    for (let at = 0; at < writes.length; at += this.#writeConcurrency) {
      await Promise.all(writes.slice(at, at + this.#writeConcurrency).map((w) => this.#write(w, views)));
    }
  }

  /** A written record whose shares moved becomes an audit record (actor: the rebalancer). */
  #recordMove(write: RecordWrite, view: AllocationView | undefined, revision: number): void {
    if (write.record === null || view === undefined) return;
    const now = this.#context.clock.now();
    const move = this.#insight.written(
      { ...view, shares: write.record.default.shares, epoch: write.record.epoch },
      revision,
      this.#engine.regionViews(),
      now,
    );
    const audit = this.#context.audit;
    if (move === undefined || audit === undefined) return;
    const record: AuditRecord = {
      at: move.at,
      actor: { role: 'system', name: 'rebalancer' },
      action: 'move',
      policy: move.policy,
      revision,
      before: null,
      after: null,
      requestId: `allocation:${revision}`,
      move: {
        epoch: move.epoch,
        from: move.from,
        to: move.to,
        reason: move.reason,
        demand: move.demand,
        ...(move.unmet === undefined ? {} : { unmet: move.unmet }),
        ...(move.target === undefined ? {} : { target: move.target }),
      },
    };
    audit.record(record).catch((error: unknown) => {
      this.#metrics.moveAuditFailures.inc();
      this.#context.log.warn(
        { err: error, move },
        'protocol: a share move could not be recorded in the audit trail',
      );
    });
  }

  /**
   * True when agents can read `payload`: it parses with AllocationRecord, the schema they read records with. A
   * record that does not is never written (every agent would drop it and keep its last good record, and a
   * successor would skip it): the write counts as failed (outcome `invalid`), so the engine keeps counting the
   * shares in force and takes the record again on the next flush; logged once until the policy's record is good.
   */
  #readable(policy: string, payload: string): boolean {
    const problem = unreadableRecord(payload);
    if (problem === undefined) {
      this.#unreadable.delete(policy);
      return true;
    }
    this.#engine.writeFailed(policy);
    this.#metrics.writes.inc({ outcome: 'invalid' });
    this.#lastWriteError = `the allocation record of ${policy} would not be readable by agents: ${problem}`;
    if (!this.#unreadable.has(policy)) {
      this.#unreadable.add(policy);
      this.#context.log.error(
        { policy, problem },
        'protocol: refused to write an allocation record agents could not read; the shares in force stay',
      );
    }
    return false;
  }

  /** Write `payload` only over the revision this writer knows (create when it knows none). */
  async #cas(key: string, payload: string): Promise<number> {
    const known = this.#revisions.get(key);
    return known === undefined
      ? this.#allocations.create(key, payload)
      : this.#allocations.update(key, payload, known);
  }

  /**
   * A compare-and-set write was refused: someone else wrote the key. A record with a newer epoch means another
   * coordinator leads (this one is fenced and stops); otherwise the key's revision is adopted and the engine's
   * record written over it on the next flush (the guard restores it too).
   */
  async #refused(key: string): Promise<void> {
    const leader = this.#context.leader!;
    const entry = await this.#allocations.get(key).catch(() => null);
    const epoch = epochOf(entry);
    this.#metrics.writes.inc({ outcome: 'refused' });
    if (epoch > leader.epoch) {
      this.#context.log.error(
        { key, epoch, own: leader.epoch },
        'protocol: an allocation record of a newer coordinator epoch: this coordinator is fenced',
      );
      leader.fenced();
      return;
    }
    if (entry !== null) this.#revisions.set(key, entry.revision);
  }

  async #write(write: RecordWrite, views: ReadonlyMap<string, AllocationView>): Promise<void> {
    const key = policyKey(write.policy);
    const leader = this.#context.leader;
    const payload =
      write.record === null
        ? null
        : JSON.stringify(
            leader === undefined ? write.record : { ...write.record, leaderEpoch: leader.epoch },
          );
    if (payload !== null && !this.#readable(write.policy, payload)) return;
    const end = this.#metrics.writeSeconds.startTimer();
    this.guard.writing(key, payload);
    try {
      if (payload === null) {
        if (leader === undefined) await this.#allocations.delete(key);
        else await this.#allocations.delete(key, { previousSeq: this.#revisions.get(key) ?? 0 });
        this.#revisions.delete(key);
        this.guard.wrote(key, undefined);
      } else {
        const revision =
          leader === undefined ? await this.#allocations.put(key, payload) : await this.#cas(key, payload);
        this.#revisions.set(key, revision);
        this.guard.wrote(key, revision);
        this.#engine.written(write.policy, write.seq, revision);
        this.#recordMove(write, views.get(write.policy), revision);
      }
      this.#metrics.writes.inc({ outcome: 'ok' });
      this.#lastWriteError = undefined;
    } catch (error) {
      if (leader !== undefined && /wrong last sequence/i.test(String(error))) await this.#refused(key);
      // The engine keeps counting the old shares until the write lands; retry on the next flush.
      this.guard.failed(key);
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

/** Why a record payload fails AllocationRecord (the agents' schema), or undefined when it parses. */
export function unreadableRecord(payload: string): string | undefined {
  const parsed = AllocationRecord.safeParse(JSON.parse(payload));
  if (parsed.success) return undefined;
  return parsed.error.issues
    .slice(0, 3)
    .map((i) => `${i.path.join('.')}: ${i.message}`)
    .join('; ');
}

/** The epoch a stored allocation record carries (0: none). */
function epochOf(entry: { json<T>(): T } | null): number {
  if (entry === null) return 0;
  try {
    const value = entry.json<{ leaderEpoch?: unknown }>();
    return typeof value.leaderEpoch === 'number' ? value.leaderEpoch : 0;
  } catch {
    return 0;
  }
}

/**
 * Every entry of a bucket that parses, with its revision; bad ones are logged, skipped and counted. Read without a
 * consumer (coordinator/nats/kv-read.ts): after a region is lost, creating one was the slowest call of a start.
 */
function parseAll<T>(options: {
  entries: readonly KvEntry[];
  schema: z.ZodType<T>;
  log: EngineContext['log'];
}): {
  loaded: Loaded<T>[];
  skipped: number;
} {
  const { entries, schema, log } = options;
  const out: Loaded<T>[] = [];
  let skipped = 0;
  for (const entry of entries) {
    if (entry.operation !== 'PUT') continue;
    const key = entry.key;
    let value: unknown;
    try {
      value = entry.json();
    } catch {
      log.warn({ key }, 'protocol: skipped an unreadable KV entry');
      skipped++;
      continue;
    }
    const parsed = schema.safeParse(value);
    if (!parsed.success) {
      log.warn({ key }, 'protocol: skipped an invalid KV entry');
      skipped++;
      continue;
    }
    out.push({ key, value: parsed.data, raw: entry.string(), revision: entry.revision });
  }
  return { loaded: out, skipped };
}
