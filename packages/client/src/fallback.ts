/**
 * The client's fallback buckets: small in-process token buckets that decide a policy's checks while the agent
 * cannot (down, frozen, overloaded, or the breaker is open), as rate-limiter-flexible's insurance limiter does.
 * They run core's bounded bucket table, the same arithmetic as the agent's Redis script and emergency buckets.
 * Each process has its own, so N service replicas admit up to N × the fallback's rate during an outage: size it
 * for one replica.
 */
import { createHash } from 'node:crypto';
import { BoundedBuckets, inProcessTtlMs } from '../../../core/buckets/bounded-buckets.js';
import type { Decision } from '../../../core/wire/bucket.js';
import { systemClock, type Clock } from '../../../core/clock.js';

/** A fallback bucket's size: burst and refill, in the policy's tokens. */
export interface FallbackBucket {
  /** Tokens the bucket holds when full (the burst one process may admit without the agent). */
  capacity: number;
  /** Tokens added per second. */
  refillPerSecond: number;
}

/** One check decided on a fallback bucket. */
export interface FallbackCheck {
  policy: string;
  subject: string;
  cost: number;
  bucket: FallbackBucket;
}

const MAX_KEY = 512;

function keyOf(policy: string, subject: string): string {
  const key = `${policy}\u0000${subject}`;
  if (key.length <= MAX_KEY) return key;
  return `${policy}\u0000#${createHash('sha256').update(subject).digest('base64url')}`;
}

export class FallbackBuckets {
  readonly #table: BoundedBuckets;
  readonly #sweeper: NodeJS.Timeout;

  constructor(maxBuckets: number, clock: Clock = systemClock) {
    this.#table = new BoundedBuckets(clock, maxBuckets);
    this.#sweeper = setInterval(() => this.#table.sweep(), 10_000);
    this.#sweeper.unref();
  }

  /** Decide all-or-nothing; undefined when a new subject finds the table full (the caller fails closed). */
  decide(checks: readonly FallbackCheck[], dryRun: boolean): Decision | undefined {
    return this.#table.decide(
      checks.map((c) => ({
        key: keyOf(c.policy, c.subject),
        capacity: c.bucket.capacity,
        refillPerSecond: c.bucket.refillPerSecond,
        cost: c.cost,
        ttlMs: inProcessTtlMs(c.bucket.capacity, c.bucket.refillPerSecond),
      })),
      dryRun,
    );
  }

  close(): void {
    clearInterval(this.#sweeper);
  }
}
