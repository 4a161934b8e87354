/**
 * One region's Redis, as the simulator sees it: token buckets keyed by subject, each decided by core's
 * `decideBucket` (core/models/token-bucket.ts), the one-bucket decision `BucketModel.evaluate` makes
 * (test/unit/simulations/engine/sim-region-store.test.ts holds the two to identical replies, and
 * test/integration/lua/token-bucket-lua-cases.test.ts holds the model to the Lua script). Keys carry the policy's
 * idle TTL; an expired key is a full bucket, as in Redis. The log kinds (sliding_log, concurrency) keep one log
 * per subject in core's `SlidingLogModel` (core/models/sliding-log.ts, the model of lua/sliding_log.lua), and a
 * concurrency slot is released by core's `leaseRelease` (core/concurrency.ts), as `DELETE /v1/leases` does.
 */
import {
  creditBucket,
  lendBucket,
  type EncodedCredit,
  type EncodedCreditResult,
  type EncodedLend,
  type EncodedLendResult,
} from '../../core/models/transfer.js';
import { leaseRelease } from '../../core/concurrency.js';
import {
  SlidingLogModel,
  slidingLogKey,
  type LogCheck,
  type LogResult,
} from '../../core/models/sliding-log.js';
import {
  decideBucket,
  type EncodedCheck,
  type EncodedResult,
  type StoredBucket,
} from '../../core/models/token-bucket.js';

interface Entry {
  /** Replaced (never mutated) on every write. */
  state: StoredBucket;
  /** µs at which the key expires. */
  expiresAt: number;
}

/** A frozen copy of a store's keys, for failover with lost writes. */
export interface StoreSnapshot {
  readonly entries: ReadonlyMap<number, Readonly<Entry>>;
}

/** The Redis key of `subject`'s log in a run (the policy is `sim`, version 1). */
export function simLogKey(subject: number): string {
  return slidingLogKey(1, String(subject), 'sim');
}

/** Buckets (or logs) of one store, one per subject (one policy per run). */
export class RegionStore {
  readonly name: string;
  #buckets = new Map<number, Entry>();
  /** Logs of the log kinds, created on first use. */
  #logs: SlidingLogModel | undefined;
  /** When each subject's log key expires (µs), for the peak-keys measure. */
  readonly #logExpiry = new Map<number, number>();
  /** Most live keys seen by `sweep`. */
  peakKeys = 0;

  constructor(name: string) {
    this.name = name;
  }

  /** Decide and charge one bucket at `now` (µs of the store's clock). */
  decide(subject: number, check: EncodedCheck, now: number): EncodedResult {
    const entry = this.#buckets.get(subject);
    const stored = entry === undefined || entry.expiresAt <= now ? undefined : entry.state;
    const { state, result } = decideBucket(stored, check, now);
    // The hot path rewrites the entry in place rather than allocating one per decision; snapshots copy entries.
    if (entry === undefined) this.#buckets.set(subject, { state, expiresAt: now + check.ttlMs * 1000 });
    else {
      entry.state = state;
      entry.expiresAt = now + check.ttlMs * 1000;
    }
    return result;
  }

  /** Decide one log check of `subject` at `now` (µs), as lua/sliding_log.lua does; `check.key` is `simLogKey`. */
  decideLog(subject: number, check: LogCheck, now: number): LogResult {
    this.#logs ??= new SlidingLogModel();
    const result = this.#logs.evaluate({ checks: [check] }, now).results[0]!;
    if (result.allowed) this.#logExpiry.set(subject, now + check.ttlMs * 1000);
    return result;
  }

  /**
   * Release the slots one concurrency admission took (its stamp, first sequence number and cost), as
   * lua/sliding_log_refund.lua does for `DELETE /v1/leases`; returns the slots freed (0 once the lease ran out).
   */
  releaseSlots(subject: number, slots: { stamp: number; seq: number; cost: number }, now: number): number {
    if (this.#logs === undefined) return 0;
    const refund = leaseRelease({
      region: this.name,
      policy: 'sim',
      version: 1,
      subject: String(subject),
      ...slots,
    });
    return this.#logs.refund(refund, now).removed[0]!;
  }

  /** Lend from `subject`'s bucket at `now` (µs), as lua/lend.lua does (core/models/transfer.ts). */
  lend(subject: number, lend: Omit<EncodedLend, 'key'>, now: number): EncodedLendResult {
    const { next, result } = lendBucket(this.peek(subject, now), lend, now);
    if (next !== undefined) this.#write(subject, next, now + lend.bucket.ttlMs * 1000);
    return result;
  }

  /** Credit `subject`'s bucket at `now` (µs), as lua/credit.lua does. */
  credit(subject: number, credit: Omit<EncodedCredit, 'key'>, now: number): EncodedCreditResult {
    const { next, result } = creditBucket(this.peek(subject, now), credit, now);
    if (next !== undefined) this.#write(subject, next, now + credit.bucket.ttlMs * 1000);
    return result;
  }

  #write(subject: number, state: StoredBucket, expiresAt: number): void {
    this.#buckets.set(subject, { state, expiresAt });
  }

  /** The stored bucket of `subject` at `now`, undefined when absent or expired. */
  peek(subject: number, now: number): StoredBucket | undefined {
    const entry = this.#buckets.get(subject);
    return entry === undefined || entry.expiresAt <= now ? undefined : entry.state;
  }

  /** Drop expired keys (as Redis's active expiry does), note the peak, and return the live count. */
  sweep(now: number): number {
    for (const [subject, entry] of this.#buckets) if (entry.expiresAt <= now) this.#buckets.delete(subject);
    for (const [subject, expiresAt] of this.#logExpiry) if (expiresAt <= now) this.#logExpiry.delete(subject);
    const live = this.#buckets.size + this.#logExpiry.size;
    this.peakKeys = Math.max(this.peakKeys, live);
    return live;
  }

  snapshot(): StoreSnapshot {
    return { entries: copyEntries(this.#buckets) };
  }

  /** Replace every key with a snapshot's (a replica promoted with the writes since lost). */
  restore(snapshot: StoreSnapshot): void {
    this.#buckets = copyEntries(snapshot.entries);
  }

  /** Lose every key (a replica promoted empty): every bucket reads as full. */
  clear(): void {
    this.#buckets = new Map();
  }
}

function copyEntries(entries: ReadonlyMap<number, Readonly<Entry>>): Map<number, Entry> {
  const out = new Map<number, Entry>();
  for (const [subject, { state, expiresAt }] of entries) out.set(subject, { state, expiresAt });
  return out;
}
