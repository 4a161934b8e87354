/**
 * One region's Redis, as the simulator sees it: token buckets keyed by subject, each decided by core's
 * `decideBucket` (core/token-bucket.ts), the one-bucket decision `BucketModel.evaluate` makes
 * (test/unit/sim-region-store.test.ts holds the two to identical replies, and
 * test/integration/token-bucket-lua-cases.test.ts holds the model to the Lua script). Keys carry the policy's
 * idle TTL; an expired key is a full bucket, as in Redis.
 */
import {
  creditBucket,
  lendBucket,
  type EncodedCredit,
  type EncodedCreditResult,
  type EncodedLend,
  type EncodedLendResult,
} from '../../core/borrowing/transfer.js';
import {
  decideBucket,
  type EncodedCheck,
  type EncodedResult,
  type StoredBucket,
} from '../../core/token-bucket.js';

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

/** Buckets of one store, one per subject (one policy per run). */
export class RegionStore {
  readonly name: string;
  #buckets = new Map<number, Entry>();
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

  /** Lend from `subject`'s bucket at `now` (µs), as lua/lend.lua does (core/borrowing/transfer.ts). */
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
    this.peakKeys = Math.max(this.peakKeys, this.#buckets.size);
    return this.#buckets.size;
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
