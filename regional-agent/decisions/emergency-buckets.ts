import { ModelBucketStore } from '../../core/bucket-store.js';
import type { BucketCheck, Decision } from '../../core/bucket-wire.js';
import { MAX_BUCKET_TTL_MS } from '../../core/bucket-wire.js';
import type { Clock } from '../../core/clock.js';
import type { Policy } from '../../core/policy.js';

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
 * admitted before it. Buckets live in the reference model (`core/bucket-store.ts`) and expire like Redis keys.
 */
export class EmergencyBuckets {
  readonly #store: ModelBucketStore;
  readonly #clock: Clock;
  readonly #options: EmergencyOptions;
  #size = 0;
  readonly #sweeper: NodeJS.Timeout;

  constructor(clock: Clock, options: EmergencyOptions) {
    this.#clock = clock;
    this.#options = options;
    this.#store = new ModelBucketStore(clock);
    this.#sweeper = setInterval(() => this.sweep(), 10_000);
    this.#sweeper.unref();
  }

  /** The emergency version of a check sized for the region: smaller, refilling slower. */
  size(policy: Policy, check: BucketCheck): BucketCheck {
    const f = this.#options.fraction;
    const capacity = Math.min(check.capacity, Math.max(policy.maxCost, check.capacity * f));
    const refillPerSecond = check.refillPerSecond * f;
    const fill = refillPerSecond > 0 ? Math.ceil((capacity / refillPerSecond) * 1000) : MAX_BUCKET_TTL_MS;
    return {
      key: check.key,
      capacity,
      refillPerSecond,
      cost: check.cost,
      ttlMs: Math.min(MAX_BUCKET_TTL_MS, Math.max(60_000, fill)),
    };
  }

  /**
   * Decide checks all-or-nothing on the emergency buckets; undefined when a check names a subject not yet
   * tracked and the table is full (the caller fails closed).
   */
  decide(checks: BucketCheck[], dryRun: boolean): Decision | undefined {
    const now = this.#clock.now() * 1000;
    let fresh = 0;
    for (const c of checks) if (this.#store.model.peek(c.key, now) === undefined) fresh++;
    if (fresh > 0 && this.#size + fresh > this.#options.maxBuckets) return undefined;
    const decision = this.#store.decideNow({ checks, dryRun });
    if (!dryRun) this.#size += fresh;
    return decision;
  }

  /** Drop expired buckets and recount; runs every 10 s. */
  sweep(): number {
    this.#size = this.#store.model.size(this.#clock.now() * 1000);
    return this.#size;
  }

  close(): void {
    clearInterval(this.#sweeper);
  }
}
