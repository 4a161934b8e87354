/**
 * A bounded table of in-process token buckets over the reference model (`core/buckets/bucket-store.ts`), for deciding
 * when the shared store cannot: the agent's emergency buckets of `onStoreFailure: local` policies, and the
 * client's fallback buckets while the agent cannot answer. Buckets expire like Redis keys; checks of subjects not
 * yet tracked are refused (undefined) once the table holds `maxBuckets`, so the caller fails closed rather than
 * grow without bound. Pure: the owner runs `sweep()` on its own timer.
 */
import { ModelBucketStore } from './bucket-store.js';
import { MAX_BUCKET_TTL_MS, type BucketCheck, type Decision } from '../wire/bucket.js';
import type { Clock } from '../clock.js';
import { encodeRefund, refundBucket } from '../models/refund.js';

/** Idle TTL of an in-process bucket: long enough to refill from empty, at least a minute. */
export function inProcessTtlMs(capacity: number, refillPerSecond: number): number {
  const fill = refillPerSecond > 0 ? Math.ceil((capacity / refillPerSecond) * 1000) : MAX_BUCKET_TTL_MS;
  return Math.min(MAX_BUCKET_TTL_MS, Math.max(60_000, fill));
}

export class BoundedBuckets {
  readonly #store: ModelBucketStore;
  readonly #clock: Clock;
  readonly #maxBuckets: number;
  #size = 0;

  constructor(clock: Clock, maxBuckets: number) {
    this.#clock = clock;
    this.#maxBuckets = maxBuckets;
    this.#store = new ModelBucketStore(clock);
  }

  /** Decide checks all-or-nothing; undefined when a check names a bucket not yet tracked and the table is full. */
  decide(checks: BucketCheck[], dryRun: boolean): Decision | undefined {
    const now = this.#clock.now() * 1000;
    let fresh = 0;
    for (const c of checks) if (this.#store.model.peek(c.key, now) === undefined) fresh++;
    if (fresh > 0 && this.#size + fresh > this.#maxBuckets) return undefined;
    const decision = this.#store.decideNow({ checks, dryRun });
    if (!dryRun) this.#size += fresh;
    return decision;
  }

  /**
   * Give back what `decide` charged (a later check of the same request refused), as `lua/refund.lua` does: never
   * above the bucket's capacity, and a bucket gone stays gone.
   */
  refund(checks: readonly { key: string; cost: number; capacity: number }[]): void {
    if (checks.length === 0) return;
    const now = this.#clock.now() * 1000;
    const encoded = encodeRefund({
      checks: checks.map(({ key, cost, capacity }) => ({ key, cost, capacity })),
    });
    encoded.checks.forEach((check, i) => {
      const stored = this.#store.model.peek(encoded.keys[i]!, now);
      const { next } = refundBucket(stored, check);
      // peek hands out the stored object itself: updating it in place is the write.
      if (stored !== undefined && next !== undefined && next !== stored) Object.assign(stored, next);
    });
  }

  /** Drop expired buckets and recount. */
  sweep(): number {
    this.#size = this.#store.model.size(this.#clock.now() * 1000);
    return this.#size;
  }
}
