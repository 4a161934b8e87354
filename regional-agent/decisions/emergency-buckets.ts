import { BoundedBuckets, inProcessTtlMs } from '../../core/buckets/bounded-buckets.js';
import type { BucketCheck, Decision } from '../../core/wire/bucket.js';
import type { Clock } from '../../core/clock.js';
import type { Policy } from '../../core/policy/policy.js';

export interface EmergencyOptions {
  /** Fraction of the region's share an emergency bucket holds (capacity and refill). */
  fraction: number;
  /** Most buckets kept in memory; checks of new subjects beyond it are refused (fail closed). */
  maxBuckets: number;
}

/**
 * The small in-process buckets that decide for `onStoreFailure: local` policies while the store cannot. Each
 * holds `fraction` of what the region enforces (capacity and refill), but at least the policy's `maxCost` so the
 * largest request can pass, and never more than the region's share. Every agent replica has its own, so a
 * region with k replicas admits at most k × fraction of its share during an outage, on top of what Redis had
 * admitted before it. Buckets live in core's bounded table (`core/buckets/bounded-buckets.ts`) and expire like Redis keys.
 */
export class EmergencyBuckets {
  readonly #table: BoundedBuckets;
  readonly #options: EmergencyOptions;
  readonly #sweeper: NodeJS.Timeout;

  constructor(clock: Clock, options: EmergencyOptions) {
    this.#options = options;
    this.#table = new BoundedBuckets(clock, options.maxBuckets);
    this.#sweeper = setInterval(() => this.sweep(), 10_000);
    this.#sweeper.unref();
  }

  /** The emergency version of a check sized for the region: smaller, refilling slower. */
  size(policy: Policy, check: BucketCheck): BucketCheck {
    const f = this.#options.fraction;
    const capacity = Math.min(check.capacity, Math.max(policy.maxCost, check.capacity * f));
    const refillPerSecond = check.refillPerSecond * f;
    return {
      key: check.key,
      capacity,
      refillPerSecond,
      cost: check.cost,
      ttlMs: inProcessTtlMs(capacity, refillPerSecond),
    };
  }

  /**
   * Decide checks all-or-nothing on the emergency buckets; undefined when a check names a subject not yet
   * tracked and the table is full (the caller fails closed).
   */
  decide(checks: BucketCheck[], dryRun: boolean): Decision | undefined {
    return this.#table.decide(checks, dryRun);
  }

  /** Give back what `decide` charged for checks of a request that was refused after all. */
  refund(checks: readonly BucketCheck[]): void {
    this.#table.refund(checks);
  }

  /** Drop expired buckets and recount; runs every 10 s. */
  sweep(): number {
    return this.#table.sweep();
  }

  close(): void {
    clearInterval(this.#sweeper);
  }
}
