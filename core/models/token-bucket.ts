import { ExpiringMap } from './expiring-map.js';
import { IdempotencyRecords, type RecordClaim } from './idempotency.js';
import { keyCostFingerprint } from '../wire/script.js';
import { DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT, idempotencyIndexKey } from '../keys.js';

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
   * interval refills at most at `floorRate` and stored tokens are first clamped to `floorCapacity`; a missing
   * bucket counts as written at time 0 and starts with at most `floorCapacity`. Lets a caller whose share dipped
   * or rose within the idle TTL refill untouched buckets at the lowest rate in force and start new ones at the
   * lowest capacity, so no share change mints.
   */
  floorBefore: number;
  floorRate: number;
  floorCapacity: number;
  /**
   * The bucket must already exist (a policy with a subject-creation cap): when it is missing, the request
   * decides nothing and its reply lists it in `missing`, so the caller can take a creation first.
   */
  mustExist?: boolean | undefined;
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
  if (stored === undefined) {
    // A missing bucket counts as written at time 0, before any floor: it starts at most at the floor's capacity,
    // so a share that rose within the idle TTL mints nothing for a bucket that did not exist.
    const tokens =
      check.floorBefore > 0 && check.floorCapacity < check.capacity ? check.floorCapacity : check.capacity;
    return { tokens, carry: 0, ts: now, rate: check.rate, capacity: check.capacity };
  }
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

/**
 * Phase one of a decision, per bucket: the bucket refilled to `now`, and whether the check's cost fits in it.
 * A request's checks are all assessed before any is concluded (all-or-nothing).
 */
export function assess(
  stored: StoredBucket | undefined,
  check: EncodedCheck,
  now: number,
): { state: StoredBucket; fits: boolean } {
  const state = refill(stored, check, now);
  return { state, fits: state.tokens >= check.cost };
}

/**
 * Phase two, per bucket, once the request's outcome is known (`allowed`: every check fits): its result, and
 * unless it is a dry run, `state` takes the tokens that remain (the caller stores it).
 */
export function conclude(
  state: StoredBucket,
  check: EncodedCheck,
  fits: boolean,
  allowed: boolean,
  dryRun: boolean,
): EncodedResult {
  const result = settle(state, check, fits, allowed);
  if (!dryRun) state.tokens = result.remaining;
  return result;
}

/**
 * A charged decision on one bucket, exactly as `BucketModel.evaluate` decides a request of one check without dry
 * run or idempotency: the state to store and the result. The simulator's stores decide with it.
 */
export function decideBucket(
  stored: StoredBucket | undefined,
  check: EncodedCheck,
  now: number,
): { state: StoredBucket; result: EncodedResult } {
  const { state, fits } = assess(stored, check, now);
  return { state, result: conclude(state, check, fits, fits, false) };
}

/** The request a script call carries, in script units. */
export interface EncodedRequest {
  keys: string[];
  checks: EncodedCheck[];
  dryRun: boolean;
  /**
   * Key of the idempotency record (same slot as the buckets), with its TTL in ms and the most live records its
   * subject keeps (default DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT); absent when none.
   */
  idempotency?: { key: string; ttlMs: number; maxRecords?: number | undefined } | undefined;
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
  /**
   * Indexes of `mustExist` buckets that were missing: nothing was decided or charged, `allowed` is false and
   * every result is zero. Absent otherwise.
   */
  missing?: number[] | undefined;
  results: EncodedResult[];
}

/** The reply to a request with `mustExist` buckets that were missing (`missing`: their indexes). */
export function missingReply(checks: number, missing: number[]): EncodedReply {
  const results = Array.from({ length: checks }, () => ({
    allowed: false,
    remaining: 0,
    retryAfterMs: 0,
    resetMs: 0,
  }));
  return { allowed: false, replayed: false, conflict: false, missing, results };
}

interface Entry<T> {
  value: T;
  /** µs at which the key expires. */
  expiresAt: number;
}

/** What an idempotency record remembers of its request: SHA-1 of its bucket keys and costs, as the script computes it. */
export function requestFingerprint(request: EncodedRequest): string {
  return keyCostFingerprint(request.checks.map((c, i) => ({ key: request.keys[i]!, cost: c.cost })));
}

/** The reply to a request whose idempotency key answers another request: nothing decided, every result zero. */
export function conflictReply(checks: number): EncodedReply {
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
  readonly #buckets = new ExpiringMap<Entry<StoredBucket>>();
  readonly #records = new IdempotencyRecords<EncodedReply>();
  /** Per subject index key: record key → expiry (ms), as the script's sorted set. */
  readonly #indexes = new ExpiringMap<Entry<Map<string, number>>>();

  /** A claim of the record key `key` at `now` (µs), as Redis answers it (`IdempotencyRecords.claim`). */
  claimRecord(key: string, value: string, ttlMs: number, now: number, peekOnly: boolean): RecordClaim {
    return this.#records.claim(key, value, ttlMs, now, peekOnly);
  }

  /** Evaluate one call at `now` (µs). Mirrors the script step for step. */
  evaluate(request: EncodedRequest, now: number): EncodedReply {
    const { idempotency } = request;
    const fingerprint = idempotency === undefined ? '' : requestFingerprint(request);
    if (idempotency !== undefined) {
      const recalled = this.#records.recall(idempotency.key, fingerprint, now);
      if (recalled === 'conflict') return conflictReply(request.checks.length);
      if (recalled !== undefined) return { ...recalled.replay, replayed: true };
    }
    const n = request.checks.length;
    // A bucket that must exist and does not: nothing is decided, the caller takes a creation first.
    const missing: number[] = [];
    request.checks.forEach((c, i) => {
      if (c.mustExist === true && this.#buckets.live(request.keys[i]!, now)?.value === undefined)
        missing.push(i);
    });
    if (missing.length > 0) return missingReply(n, missing);
    const states: StoredBucket[] = new Array<StoredBucket>(n);
    const fits: boolean[] = new Array<boolean>(n);
    let allowed = true;
    for (let i = 0; i < n; i++) {
      const assessed = assess(this.#buckets.live(request.keys[i]!, now)?.value, request.checks[i]!, now);
      states[i] = assessed.state;
      fits[i] = assessed.fits;
      if (!assessed.fits) allowed = false;
    }
    const { dryRun } = request;
    const results: EncodedResult[] = new Array<EncodedResult>(n);
    for (let i = 0; i < n; i++) {
      const state = states[i]!;
      const check = request.checks[i]!;
      results[i] = conclude(state, check, fits[i]!, allowed, dryRun);
      if (!dryRun) this.#buckets.set(request.keys[i]!, { value: state, expiresAt: now + check.ttlMs * 1000 });
    }
    const reply: EncodedReply = { allowed, replayed: false, conflict: false, results };
    if (idempotency !== undefined && this.#records.keep(idempotency, fingerprint, reply, now, dryRun)) {
      this.#index(idempotency.key, idempotency.ttlMs, idempotency.maxRecords, now);
    }
    return reply;
  }

  /** The script's index step: drop expired entries, add this record, delete those closest to expiry past the most. */
  #index(recordKey: string, ttlMs: number, maxRecords: number | undefined, now: number): void {
    const key = idempotencyIndexKey(recordKey);
    const index = this.#indexes.live(key, now)?.value ?? new Map<string, number>();
    const nowMs = Math.floor(now / 1000);
    for (const [member, until] of index) if (until <= nowMs) index.delete(member);
    index.set(recordKey, nowMs + ttlMs);
    // Redis orders equal scores by member, bytewise.
    const byExpiry = [...index].sort(([a, x], [b, y]) => x - y || (a < b ? -1 : a > b ? 1 : 0));
    const over = index.size - (maxRecords ?? DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT);
    for (const [member] of byExpiry.slice(0, Math.max(0, over))) {
      index.delete(member);
      this.#records.forget(member, now);
    }
    const last = byExpiry.at(-1)![1];
    this.#indexes.set(key, { value: index, expiresAt: now + (last - nowMs) * 1000 });
  }

  /** The stored state of a bucket, as Redis would return it at `now` (undefined once expired). */
  peek(key: string, now: number): StoredBucket | undefined {
    return this.#buckets.live(key, now)?.value;
  }

  /** Store a bucket until `expiresAt` (µs), as a script's HSET and PEXPIRE would (core/models/transfer.ts). */
  write(key: string, bucket: StoredBucket, expiresAt: number): void {
    this.#buckets.set(key, { value: bucket, expiresAt });
  }

  /** Number of live keys at `now` (buckets, records and record indexes), after dropping expired ones. */
  size(now: number): number {
    return this.#buckets.keys(now).length + this.#records.keys(now).length + this.#indexes.keys(now).length;
  }

  /** Live idempotency records at `now` (what the per-subject cap bounds). */
  records(now: number): string[] {
    return this.#records.keys(now);
  }
}
