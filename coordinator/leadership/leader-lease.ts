/**
 * One active coordinator among several: a leader lease in JetStream KV (bucket `<ns>-leader`, key `coordinator`).
 * The value names the holder and its **epoch**; every write is a compare-and-set on the entry's revision, so of
 * two coordinators racing for the same revision exactly one wins, and every taking-over bumps the epoch.
 *
 * - A candidate takes a missing or released lease at once. A lease someone else holds is taken only after its
 *   entry has stayed at one revision for `leaseMs` on the candidate's own monotonic clock (`performance.now()`,
 *   never a wall clock: no skew between machines counts), measured from when the candidate first saw that
 *   revision, which is after the holder sent the renewal that made it.
 * - The holder renews every `leaseMs / 3` (after a failed renewal sooner: 250 ms, doubling up to that third)
 *   and is leader only while its last renewal was **sent** less than
 *   `leaseMs` ago (monotonic again). So a holder cut off from the KV stops acting before any candidate can take
 *   over: the candidate's wait starts after the holder's last renewal was sent, and is as long.
 * - A renewal refused because the revision moved means another coordinator took the lease: this one lost at once,
 *   unless the entry still names this holder and epoch (a renewal of its own that timed out but landed).
 * - A graceful stop releases the lease (same epoch, no holder), so a standby or a restart takes it without waiting.
 *
 * Takeover time after the leader's region is cut off: the longer of leaseMs (after its last renewal) and what
 * JetStream needs to elect new stream leaders among the servers that remain, plus one poll (at most 1 s). The
 * lease must outlast JetStream's elections (seconds): a heal makes streams elect again, and a renewal fails
 * until they have; a lease shorter than that would depose a healthy leader.
 */
import { hostname } from 'node:os';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { z } from 'zod';
import { LeaderEpoch } from '../../core/wire/protocol.js';
import type { Logger } from '../ports.js';
import { ensureReplicas } from '../nats/replicas.js';

export const LEADER_KEY = 'coordinator';

/** The leader lease's value. */
export const LeaderRecord = z.strictObject({
  /** Who holds it; null once released. */
  holder: z.string().min(1).max(128).nullable(),
  epoch: LeaderEpoch,
  leaseMs: z.number().int().positive(),
  /** Wall-clock time of the write, for people reading the bucket; never used to decide anything. */
  at: z.string(),
});
export type LeaderRecord = z.infer<typeof LeaderRecord>;

export interface LeaderLeaseOptions {
  nc: NatsConnection;
  bucket: string;
  leaseMs: number;
  /** This coordinator's name in the lease (unique per process). */
  holder?: string;
  replicas: number;
  timeoutMs: number;
  log: Logger;
  /** The highest epoch any record already carries: a new epoch is above it even if the lease bucket was lost. */
  floor?: () => Promise<number>;
  /** Monotonic milliseconds; default performance.now. */
  now?: () => number;
  /** The lease bucket itself, already open (tests); default: opened on `nc`. */
  kv?: Pick<KV, 'get' | 'create' | 'update'>;
}

export type LostReason = 'superseded' | 'expired' | 'stopped';

/** The default holder name: host, pid and a random suffix, so two processes never share one. */
export function defaultHolder(): string {
  return `${hostname().slice(0, 64)}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

export class LeaderLease {
  readonly #options: LeaderLeaseOptions;
  readonly #now: () => number;
  readonly holder: string;
  #kv: Pick<KV, 'get' | 'create' | 'update'> | undefined;
  #revision = 0;
  #epoch = 0;
  /** Monotonic time the last successful renewal (or the acquiring write) was sent. */
  #renewedSentAt = -Infinity;
  #lost: LostReason | undefined;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  #wakeWait: (() => void) | undefined;
  readonly #lostListeners = new Set<(reason: LostReason) => void>();

  constructor(options: LeaderLeaseOptions) {
    this.#options = options;
    this.#now = options.now ?? (() => performance.now());
    this.holder = options.holder ?? defaultHolder();
  }

  /** The epoch this coordinator leads with (0 before it leads). */
  get epoch(): number {
    return this.#epoch;
  }

  /** True while this coordinator holds the lease and its last renewal was sent less than leaseMs ago. */
  isLeader(): boolean {
    return (
      this.#lost === undefined && this.#epoch > 0 && this.#now() - this.#renewedSentAt < this.#options.leaseMs
    );
  }

  /** Why leadership ended, once it has. */
  get lost(): LostReason | undefined {
    return this.#lost;
  }

  onLost(listener: (reason: LostReason) => void): () => void {
    this.#lostListeners.add(listener);
    return () => this.#lostListeners.delete(listener);
  }

  /** Open (or create) the bucket with its replicas. */
  async open(): Promise<void> {
    if (this.#options.kv !== undefined) {
      this.#kv = this.#options.kv;
      return;
    }
    const { nc, bucket, replicas, timeoutMs } = this.#options;
    const js = jetstream(nc, { timeout: timeoutMs });
    this.#kv = await new Kvm(js).create(bucket, {
      history: 1,
      replicas,
      description: 'quotaplane coordinator leader lease',
    });
    await ensureReplicas(await jetstreamManager(nc, { timeout: timeoutMs }), `KV_${bucket}`, replicas);
  }

  /**
   * Wait until this coordinator holds the lease; resolves with its epoch, rejects when stopped first. Polls every
   * pollMs(leaseMs) (a quarter lease, at most 1 s) and starts renewing once it leads.
   */
  async acquire(): Promise<number> {
    const { leaseMs, log } = this.#options;
    let seen: { revision: number; since: number } | undefined;
    let announced = false;
    while (!this.#stopped) {
      try {
        // A standby started while JetStream elects (after a heal: "no responders", "temporarily unavailable")
        // waits for it rather than failing its start.
        if (this.#kv === undefined) await this.open();
        const kv = this.#kv!;
        const entry = await kv.get(LEADER_KEY);
        const floor = async () =>
          (await this.#options.floor?.().catch((error: unknown) => {
            log.debug({ err: error }, 'leader lease: epoch floor not read; counting 0');
            return 0;
          })) ?? 0;
        if (entry === null || entry.operation !== 'PUT') {
          const epoch = (await floor()) + 1;
          const sentAt = this.#now();
          const revision =
            entry === null
              ? await kv.create(LEADER_KEY, this.#value(epoch))
              : await kv.update(LEADER_KEY, this.#value(epoch), entry.revision);
          return this.#lead(epoch, revision, sentAt);
        }
        const current = LeaderRecord.safeParse(entryJson(entry));
        const previousEpoch = current.success ? current.data.epoch : 0;
        const free = current.success && current.data.holder === null;
        if (seen?.revision !== entry.revision) {
          // At debug: a takeover that comes late says here whether the holder kept renewing (or reads went back
          // and forth between revisions) or the lease was simply waited out.
          log.debug(
            {
              revision: entry.revision,
              before: seen?.revision,
              holder: current.success ? current.data.holder : undefined,
            },
            'leader lease: a new revision; waiting a lease from now',
          );
          seen = { revision: entry.revision, since: this.#now() };
        }
        const waited = this.#now() - seen.since;
        if (free || !current.success || waited >= leaseMs) {
          // At debug: when a takeover is slow, this says whether the wait or the writes after it took the time.
          log.debug({ previousEpoch, waitedMs: Math.round(waited), free }, 'leader lease: taking it');
          const epoch = Math.max(previousEpoch, await floor()) + 1;
          const sentAt = this.#now();
          const revision = await kv.update(LEADER_KEY, this.#value(epoch), entry.revision);
          return this.#lead(epoch, revision, sentAt);
        }
        if (!announced) {
          announced = true;
          log.info(
            { holder: current.data.holder, epoch: previousEpoch },
            'leader lease held by another coordinator; standing by',
          );
        }
      } catch (error) {
        // Someone else won the race, or the KV is unreachable (a partition, an election): look again. The wait
        // for the revision already seen goes on: the holder cannot have renewed without changing it.
        log.debug({ err: error }, 'leader lease: not taken this time');
      }
      await this.#sleep(pollMs(leaseMs));
    }
    throw new Error('leader lease: stopped before leading');
  }

  /** Stop renewing; release the lease if held, so a standby takes it without waiting. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    clearTimeout(this.#timer);
    this.#wakeWait?.();
    const held = this.isLeader();
    this.#lose('stopped');
    if (!held || this.#kv === undefined) return;
    const released: LeaderRecord = {
      holder: null,
      epoch: this.#epoch,
      leaseMs: this.#options.leaseMs,
      at: new Date().toISOString(),
    };
    await this.#kv.update(LEADER_KEY, JSON.stringify(released), this.#revision).catch((error: unknown) => {
      this.#options.log.warn({ err: error }, 'leader lease: could not release; a standby waits it out');
    });
  }

  #value(epoch: number): string {
    const record: LeaderRecord = {
      holder: this.holder,
      epoch,
      leaseMs: this.#options.leaseMs,
      at: new Date().toISOString(),
    };
    return JSON.stringify(record);
  }

  #lead(epoch: number, revision: number, sentAt: number): number {
    this.#epoch = epoch;
    this.#revision = revision;
    this.#renewedSentAt = sentAt;
    this.#options.log.info({ holder: this.holder, epoch }, 'leader lease taken: this coordinator leads');
    this.#scheduleRenewal();
    return epoch;
  }

  /**
   * The next renewal: a third of a lease after a success; after a failure sooner, by a backoff from
   * RENEW_RETRY_MS doubling up to that third, so a JetStream that answers again (a stream leader elected after a
   * heal: 503 "no responders" or timeouts for a few seconds) is tried several times before the lease runs out.
   */
  #scheduleRenewal(failures = 0): void {
    if (this.#stopped || this.#lost !== undefined) return;
    const third = Math.max(10, Math.floor(this.#options.leaseMs / 3));
    const delay = failures === 0 ? third : Math.min(third, RENEW_RETRY_MS * 2 ** (failures - 1));
    this.#timer = setTimeout(() => void this.#renew(failures), delay);
    this.#timer.unref();
  }

  async #renew(failures: number): Promise<void> {
    if (this.#stopped || this.#lost !== undefined) return;
    const kv = this.#kv!;
    const sentAt = this.#now();
    // A check on the way: a renewal that could not land in time must not leave a zombie acting meanwhile.
    const expiry = setTimeout(
      () => {
        if (!this.isLeader()) this.#lose('expired');
      },
      Math.max(0, this.#renewedSentAt + this.#options.leaseMs - sentAt),
    );
    expiry.unref();
    let next = 0;
    try {
      this.#revision = await kv.update(LEADER_KEY, this.#value(this.#epoch), this.#revision);
      if (this.#lost === undefined) this.#renewedSentAt = sentAt;
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      if (/wrong last sequence/i.test(message)) {
        // The revision moved. A renewal of ours that timed out on the way back may have landed all the same (a
        // stream electing its leader answers late): then the entry still names this holder and epoch, and the
        // renewal goes on from its revision. Anything else is another coordinator's write.
        const own = await this.#ownEntry(kv);
        if (own === undefined) {
          this.#options.log.warn({ epoch: this.#epoch }, 'leader lease taken by another coordinator');
          this.#lose('superseded');
          return;
        }
        this.#revision = own;
        this.#options.log.info(
          { epoch: this.#epoch, revision: own },
          'leader lease: an earlier renewal landed late; renewing from its revision',
        );
      } else this.#options.log.warn({ err: error }, 'leader lease: renewal failed; retrying');
      if (!this.isLeader()) this.#lose('expired');
      next = failures + 1;
    } finally {
      clearTimeout(expiry);
    }
    this.#scheduleRenewal(next);
  }

  /**
   * The lease entry's revision when it still names this holder at this epoch; undefined when it names anyone or
   * anything else. An entry that cannot be read counts as ours for now: the renewal is retried, and a lease
   * that is not renewed in time expires all the same.
   */
  async #ownEntry(kv: Pick<KV, 'get'>): Promise<number | undefined> {
    try {
      const entry = await kv.get(LEADER_KEY);
      if (entry === null || entry.operation !== 'PUT') return undefined;
      const value = LeaderRecord.safeParse(entryJson(entry));
      return value.success && value.data.holder === this.holder && value.data.epoch === this.#epoch
        ? entry.revision
        : undefined;
    } catch {
      return this.#revision;
    }
  }

  #lose(reason: LostReason): void {
    if (this.#lost !== undefined) return;
    this.#lost = reason;
    clearTimeout(this.#timer);
    if (reason !== 'stopped') {
      this.#options.log.error(
        { epoch: this.#epoch, reason },
        'leader lease lost: this coordinator stops acting',
      );
    }
    for (const listener of this.#lostListeners) listener(reason);
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      timer.unref();
      this.#wakeWait = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }
}

/** First retry of a failed renewal, ms; each further one waits twice as long, up to a third of the lease. */
export const RENEW_RETRY_MS = 250;

/** How often a standby looks at the lease: a quarter lease, at most a second. */
export function pollMs(leaseMs: number): number {
  return Math.max(25, Math.min(1000, Math.floor(leaseMs / 4)));
}

function entryJson(entry: { json<T>(): T }): unknown {
  try {
    return entry.json<unknown>();
  } catch {
    return undefined;
  }
}
