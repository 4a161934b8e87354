/**
 * The leader's demand snapshots in JetStream KV (`<ns>-demand`, one key per regional policy; what they hold:
 * core/lease/demand-snapshot.ts): read once when an engine starts, so a coordinator that takes over continues
 * from its predecessor's demand and move state, and written after each round for the policies whose snapshot is
 * due (at most one per policy per snapshot interval). A snapshot that does not parse, is larger than
 * MAX_DEMAND_SNAPSHOT_BYTES or carries a newer leader epoch is ignored and counted; none of it ever stops the
 * engine (a coordinator without snapshots starts as one always did).
 */
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import {
  DemandSnapshot,
  DEMAND_SNAPSHOT_MAX_AGE_MS,
  MAX_DEMAND_SNAPSHOT_BYTES,
} from '../../core/lease/demand-snapshot.js';
import type { SnapshotWrite } from '../../core/lease/lease-coordinator.js';
import { policyKey, policyNameFromKey } from '../../core/wire/kv.js';
import { latestEntries, openBucket, type OpenedBucket } from '../nats/kv-read.js';
import type { EngineContext } from '../ports.js';
import type { ProtocolMetrics } from './protocol-metrics.js';

/** Settings of the demand bucket: one value per policy, no history, values bounded. */
export const DEMAND_BUCKET_OPTIONS = {
  history: 1,
  maxValueSize: MAX_DEMAND_SNAPSHOT_BYTES,
  description: 'quotaplane demand snapshots of the leading coordinator (key: policy name with . as =)',
} as const;

/** How old a snapshot the engine still uses, ms (docs/protocol.md "Taking over"). */
export { DEMAND_SNAPSHOT_MAX_AGE_MS };

/**
 * Longest a coordinator's start waits for the snapshot bucket, ms, to open it and then to read it. A successor
 * takes over while JetStream may still be electing the leaders of streams whose leader was in the lost region;
 * the snapshots are a head start, never a reason to serve later. A bucket that opens after this is used for the
 * writes from then on; snapshots not read in time are done without.
 */
export const SNAPSHOT_START_MS = 2000;

/** First wait before the bucket is tried again after a failed open, ms; it doubles up to MAX_OPEN_RETRY_MS. */
const OPEN_RETRY_MS = 1000;
const MAX_OPEN_RETRY_MS = 60_000;

/** `promise`'s value, or `undefined` once `ms` passed first (the promise goes on). */
async function within<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

export class DemandSnapshots {
  readonly #context: EngineContext;
  /** Undefined until the bucket is open (tried again in the background until it is): none is kept meanwhile. */
  #kv: KV | undefined;
  /** The keys the bucket held when it opened, and a view through its leader, for `load` (kv-read.ts). */
  #opened: OpenedBucket | undefined;
  readonly #metrics: Pick<ProtocolMetrics, 'snapshots'>;
  #writing: Promise<void> = Promise.resolve();
  #failedOpens = 0;
  #retry: NodeJS.Timeout | undefined;
  #closed = false;

  private constructor(
    context: EngineContext,
    kv: KV | undefined,
    metrics: Pick<ProtocolMetrics, 'snapshots'>,
  ) {
    this.#context = context;
    this.#kv = kv;
    this.#metrics = metrics;
  }

  /**
   * Create (or bind to) the bucket. A failure (JetStream still electing, or a NATS server configuration generated
   * before the bucket existed, which refuses it to the coordinator's credentials) is logged and counted
   * (`unavailable`) once, and the bucket is tried again in the background (every second, doubling to a minute)
   * until it opens: the engine runs without snapshots meanwhile, as it did before them, and writes them from then on.
   */
  static async open(
    context: EngineContext,
    metrics: Pick<ProtocolMetrics, 'snapshots'>,
  ): Promise<DemandSnapshots> {
    const self = new DemandSnapshots(context, undefined, metrics);
    const opening = self.#tryOpen(OPEN_RETRY_MS);
    if ((await within(opening, SNAPSHOT_START_MS)) === undefined) {
      context.log.warn(
        { bucket: context.names.demand, waitedMs: SNAPSHOT_START_MS },
        'protocol: the demand snapshot bucket is not open yet; starting without snapshots, writing them once it is',
      );
    }
    return self;
  }

  /** One attempt to open the bucket; after a failure, the next one `delayMs` later (until closed). */
  async #tryOpen(delayMs: number): Promise<boolean> {
    const { nc, names, config, log } = this.#context;
    try {
      // No account check (JetStream was checked when the store opened): none of this needs the meta leader once
      // the bucket exists.
      const kvm = new Kvm(jetstream(nc, { timeout: config.natsTimeoutMs, checkAPI: false }));
      const jsm = await jetstreamManager(nc, { timeout: config.natsTimeoutMs, checkAPI: false });
      const opened = await openBucket(kvm, jsm, names.demand, {
        ...DEMAND_BUCKET_OPTIONS,
        replicas: config.replicas ?? 1,
      });
      if (this.#closed) return false;
      this.#kv = opened.kv;
      this.#opened = opened;
      if (this.#failedOpens > 0) {
        log.info(
          { bucket: names.demand, failedAttempts: this.#failedOpens },
          'protocol: the demand snapshot bucket is open; writing snapshots from now on',
        );
      }
      return true;
    } catch (error) {
      // Closed, or its connection is: no further attempt.
      if (this.#closed || nc.isClosed()) return false;
      this.#failedOpens += 1;
      if (this.#failedOpens === 1) {
        this.#metrics.snapshots.inc({ outcome: 'unavailable' });
        log.warn(
          { err: error, bucket: names.demand },
          'protocol: the demand snapshot bucket cannot be opened; running without demand snapshots and trying again',
        );
      } else
        log.debug(
          { err: error, bucket: names.demand },
          'protocol: the demand snapshot bucket still cannot be opened',
        );
      this.#retry = setTimeout(() => void this.#tryOpen(Math.min(2 * delayMs, MAX_OPEN_RETRY_MS)), delayMs);
      this.#retry.unref();
      return false;
    }
  }

  /**
   * Every stored snapshot a successor may use. Unreadable, oversized or foreign-keyed ones and those of a newer
   * leader epoch than this coordinator's are counted (`invalid`, `newer_epoch`) and left out; a failure to list
   * the bucket leaves them all out (logged), never the start.
   */
  async load(): Promise<DemandSnapshot[]> {
    const read = await within(this.#read(), SNAPSHOT_START_MS);
    if (read === undefined) {
      this.#context.log.warn(
        { waitedMs: SNAPSHOT_START_MS },
        'protocol: demand snapshots not read in time; starting without',
      );
    }
    return read ?? [];
  }

  async #read(): Promise<DemandSnapshot[]> {
    const out: DemandSnapshot[] = [];
    const own = this.#context.leader?.epoch;
    const opened = this.#opened;
    if (opened === undefined) return out;
    try {
      // Without a consumer (its creation needs JetStream's meta leader, which a takeover may find still being
      // elected): every request bounded by the client's timeout, the values side by side.
      const entries = await latestEntries(opened.reader, opened.keys);
      for (const entry of entries) {
        if (entry === null || entry.operation !== 'PUT') continue;
        const key = entry.key;
        const snapshot = parseSnapshot(entry.string());
        if (snapshot === undefined || policyNameFromKey(key) !== snapshot.policy) {
          this.#metrics.snapshots.inc({ outcome: 'invalid' });
          this.#context.log.warn({ key }, 'protocol: ignored an invalid demand snapshot');
          continue;
        }
        if (own !== undefined && (snapshot.leaderEpoch ?? 0) > own) {
          this.#metrics.snapshots.inc({ outcome: 'newer_epoch' });
          continue;
        }
        out.push(snapshot);
      }
    } catch (error) {
      this.#context.log.warn(
        { err: error },
        'protocol: demand snapshots could not be read; starting without',
      );
    }
    return out;
  }

  /** What the engine made of the snapshots it was given (restored, stale, …), counted. */
  counted(outcomes: ReadonlyMap<string, number>): void {
    for (const [outcome, n] of outcomes) this.#metrics.snapshots.inc({ outcome }, n);
  }

  /**
   * Write the snapshots due, stamped with this leader's epoch (one chain of writes at a time; a failed one is
   * counted and simply replaced by the next due). A coordinator that does not lead writes none.
   */
  write(writes: readonly SnapshotWrite[]): void {
    const kv = this.#kv;
    if (writes.length === 0 || kv === undefined) return;
    const leader = this.#context.leader;
    this.#writing = this.#writing.then(async () => {
      if (leader !== undefined && !leader.isLeader()) return;
      for (const { policy, snapshot } of writes) {
        const key = policyKey(policy);
        try {
          if (snapshot === null) await kv.delete(key);
          else {
            const stamped = leader === undefined ? snapshot : { ...snapshot, leaderEpoch: leader.epoch };
            await kv.put(key, JSON.stringify(stamped));
            this.#metrics.snapshots.inc({ outcome: 'written' });
          }
        } catch (error) {
          this.#metrics.snapshots.inc({ outcome: 'write_failed' });
          this.#context.log.warn({ err: error, policy }, 'protocol: demand snapshot write failed');
        }
      }
    });
  }

  /** Stop trying to open the bucket and wait for the writes under way. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#retry);
    await this.#writing;
  }
}

/** A stored snapshot, or undefined when it is too large, not JSON or not a snapshot. */
export function parseSnapshot(raw: string): DemandSnapshot | undefined {
  if (raw.length > MAX_DEMAND_SNAPSHOT_BYTES) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    return undefined;
  }
  const parsed = DemandSnapshot.safeParse(value);
  return parsed.success ? parsed.data : undefined;
}
