import { createHash } from 'node:crypto';

/**
 * The reference token bucket: the exact arithmetic of `lua/token_bucket.lua`, in TypeScript.
 *
 * Units inside this module are those of the script: tokens in **micro-tokens** (integers), time in
 * **microseconds**, rates in tokens per second (= micro-tokens per microsecond). Refill carries its
 * fractional remainder (`carry`, in [0, 1) micro-token) so a bucket hit every few microseconds still refills.
 * Every operation here is written in the same order as in the script so that both produce the same doubles;
 * a shared case table (test/cases/) holds them to it.
 */

/** Micro-tokens per token. */
export const MICRO = 1_000_000;

/** The parameters of one bucket check, in script units. */
export interface EncodedCheck {
  /** Capacity in micro-tokens (integer ≥ 0). */
  capacity: number;
  /** Refill in tokens per second (≥ 0). */
  rate: number;
  /** Cost in micro-tokens (integer ≥ 1). */
  cost: number;
  /** Idle TTL in milliseconds (integer ≥ 1). */
  ttlMs: number;
  /**
   * Rate-history floor: for a bucket last written before `floorBefore` (µs, Redis time; 0 = none), the elapsed
   * interval refills at most at `floorRate` and stored tokens are first clamped to `floorCapacity`. Lets a caller
   * whose share dipped and rose again since that time refill untouched buckets at the lowest rate in force.
   */
  floorBefore: number;
  floorRate: number;
  floorCapacity: number;
}

/** What the script stores per bucket. */
export interface StoredBucket {
  /** Micro-tokens (integer). */
  tokens: number;
  /** Fraction of a micro-token carried to the next refill, in [0, 1). */
  carry: number;
  /** Last update, µs of Redis time. Never moves backwards. */
  ts: number;
  /** Refill rate in force at the last update, tokens/s. */
  rate: number;
  /** Capacity in force at the last update, micro-tokens. */
  capacity: number;
}

/** One bucket's decision, in script units. */
export interface EncodedResult {
  allowed: boolean;
  /** Micro-tokens left after this decision (before it, when denied). */
  remaining: number;
  /** Milliseconds until the cost could fit; 0 when it fits; -1 when it never can (cost above capacity, no refill). */
  retryAfterMs: number;
  /** Milliseconds until the bucket is full again; -1 when it never will be. */
  resetMs: number;
}

/**
 * The bucket as it stands at `now`: refilled over the elapsed interval at the lower of the stored and the new rate,
 * up to the lower of the stored and the new capacity, so neither a rate nor a capacity change mints tokens.
 */
export function refill(stored: StoredBucket | undefined, check: EncodedCheck, now: number): StoredBucket {
  if (stored === undefined)
    return { tokens: check.capacity, carry: 0, ts: now, rate: check.rate, capacity: check.capacity };
  let tokens = stored.tokens;
  let rate = Math.min(stored.rate, check.rate);
  const ceiling = Math.min(stored.capacity, check.capacity);
  if (check.floorBefore > 0 && stored.ts < check.floorBefore) {
    rate = Math.min(rate, check.floorRate);
    tokens = Math.min(tokens, check.floorCapacity);
  }
  const elapsed = Math.max(0, now - stored.ts);
  const gained = elapsed * rate + stored.carry;
  const whole = Math.floor(gained);
  let carry = gained - whole;
  tokens = tokens + whole;
  if (tokens >= ceiling) {
    tokens = ceiling;
    carry = 0;
  }
  return { tokens, carry, ts: Math.max(stored.ts, now), rate: check.rate, capacity: check.capacity };
}

/** Microseconds of refill at `rate` until `tokens` (+ `carry`) reaches `target`; -1 when it never does. */
export function microsUntil(tokens: number, carry: number, target: number, rate: number): number {
  if (tokens >= target) return 0;
  if (rate <= 0) return -1;
  const need = target - tokens - carry;
  let us = Math.ceil(need / rate);
  if (us * rate + carry < target - tokens) us = us + 1;
  return us;
}

function msFromMicros(us: number): number {
  return us < 0 ? -1 : Math.ceil(us / 1000);
}

/**
 * One bucket's result once the all-or-nothing outcome is known: `allowed` says whether the whole call admits
 * (then this bucket is charged), `fits` whether this bucket alone had room.
 */
export function settle(
  state: StoredBucket,
  check: EncodedCheck,
  fits: boolean,
  allowed: boolean,
): EncodedResult {
  const remaining = allowed ? state.tokens - check.cost : state.tokens;
  let retryAfterMs = 0;
  if (!fits) {
    retryAfterMs =
      check.cost > check.capacity
        ? -1
        : msFromMicros(microsUntil(state.tokens, state.carry, check.cost, check.rate));
  }
  const resetMs = msFromMicros(microsUntil(remaining, state.carry, check.capacity, check.rate));
  return { allowed: fits && allowed, remaining, retryAfterMs, resetMs };
}

/** The request a script call carries, in script units. */
export interface EncodedRequest {
  keys: string[];
  checks: EncodedCheck[];
  dryRun: boolean;
  /** Key of the idempotency record (same slot as the buckets), with its TTL in ms; absent when none. */
  idempotency?: { key: string; ttlMs: number } | undefined;
}

/** What a script call answers. */
export interface EncodedReply {
  allowed: boolean;
  /** True when an idempotency record answered: the first decision, replayed, nothing charged. */
  replayed: boolean;
  /**
   * True when the idempotency key already answers a different request (other bucket keys or costs): nothing
   * was decided or charged, and every result is zero.
   */
  conflict: boolean;
  results: EncodedResult[];
}

interface Entry<T> {
  value: T;
  /** µs at which the key expires. */
  expiresAt: number;
}

/** What an idempotency record remembers of its request: SHA-1 of its bucket keys and costs, as the script computes it. */
export function requestFingerprint(request: EncodedRequest): string {
  const parts = request.checks.map((c, i) => `${request.keys[i]!} ${String(c.cost)}`);
  return createHash('sha1').update(parts.join('\n'), 'utf8').digest('hex');
}

function conflictReply(checks: number): EncodedReply {
  const results = Array.from({ length: checks }, () => ({
    allowed: false,
    remaining: 0,
    retryAfterMs: 0,
    resetMs: 0,
  }));
  return { allowed: false, replayed: false, conflict: true, results };
}

/**
 * An in-memory Redis holding buckets and idempotency records the way the script does, TTLs included:
 * the model the Lua script must agree with, and the bucket store of the simulator.
 */
export class BucketModel {
  readonly #buckets = new Map<string, Entry<StoredBucket>>();
  readonly #records = new Map<string, Entry<{ fingerprint: string; reply: EncodedReply }>>();

  /** Evaluate one call at `now` (µs). Mirrors the script step for step. */
  evaluate(request: EncodedRequest, now: number): EncodedReply {
    const { idempotency } = request;
    if (idempotency !== undefined) {
      const record = this.#live(this.#records, idempotency.key, now);
      if (record !== undefined) {
        if (record.fingerprint === requestFingerprint(request)) return { ...record.reply, replayed: true };
        return conflictReply(request.checks.length);
      }
    }
    const n = request.checks.length;
    const states: StoredBucket[] = new Array<StoredBucket>(n);
    const fits: boolean[] = new Array<boolean>(n);
    let allowed = true;
    for (let i = 0; i < n; i++) {
      const check = request.checks[i]!;
      const state = refill(this.#live(this.#buckets, request.keys[i]!, now), check, now);
      states[i] = state;
      fits[i] = state.tokens >= check.cost;
      if (!fits[i]) allowed = false;
    }
    const results: EncodedResult[] = new Array<EncodedResult>(n);
    for (let i = 0; i < n; i++) {
      const state = states[i]!;
      const check = request.checks[i]!;
      const result = settle(state, check, fits[i]!, allowed);
      results[i] = result;
      if (!request.dryRun) {
        state.tokens = result.remaining;
        this.#buckets.set(request.keys[i]!, { value: state, expiresAt: now + check.ttlMs * 1000 });
      }
    }
    const reply: EncodedReply = { allowed, replayed: false, conflict: false, results };
    if (idempotency !== undefined && !request.dryRun) {
      this.#records.set(idempotency.key, {
        value: { fingerprint: requestFingerprint(request), reply },
        expiresAt: now + idempotency.ttlMs * 1000,
      });
    }
    return reply;
  }

  /** The stored state of a bucket, as Redis would return it at `now` (undefined once expired). */
  peek(key: string, now: number): StoredBucket | undefined {
    return this.#live(this.#buckets, key, now);
  }

  /** Number of live keys at `now` (buckets and records), after dropping expired ones. */
  size(now: number): number {
    for (const map of [this.#buckets, this.#records] as Map<string, Entry<unknown>>[]) {
      for (const [key, entry] of map) if (entry.expiresAt <= now) map.delete(key);
    }
    return this.#buckets.size + this.#records.size;
  }

  #live<T>(map: Map<string, Entry<T>>, key: string, now: number): T | undefined {
    const entry = map.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= now) {
      map.delete(key);
      return undefined;
    }
    return entry.value;
  }
}
