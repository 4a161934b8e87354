/**
 * Idempotency records as the Lua scripts keep them, for the in-memory models that must agree with the scripts:
 * one record per key, holding the fingerprint of the request it answered and that answer, until it expires.
 */

import { ExpiringMap } from './expiring-map.js';

/** A request's idempotency: the record's key and how long it is kept, ms. */
export interface RecordSpec {
  key: string;
  ttlMs: number;
}

/** What a live record says to a request. */
export type Recall<R> = { replay: R } | 'conflict' | undefined;

/** How a claim of a record key went (`claim`). */
export type RecordClaim = 'new' | 'same' | 'conflict';

export class IdempotencyRecords<R extends { allowed: boolean }> {
  /** `reply` undefined: the key is held by a claim (`claim`), whose value answers no request. */
  readonly #records = new ExpiringMap<{ fingerprint: string; reply: R | undefined; expiresAt: number }>();

  /**
   * What the record under `key` says at `now` (µs) to a request with `fingerprint`: its answer to replay (the same
   * request), `'conflict'` (another request under the same key), or undefined when there is none.
   */
  recall(key: string, fingerprint: string, now: number): Recall<R> {
    const record = this.#records.live(key, now);
    if (record === undefined) return undefined;
    return record.fingerprint === fingerprint && record.reply !== undefined
      ? { replay: record.reply }
      : 'conflict';
  }

  /**
   * A several-group request's claim of `key` (regional-agent/decisions/idempotency-claim.ts), as Redis does
   * `SET key value PX ttlMs NX GET` at `now` (µs), or `GET` when `peekOnly`: `new` when the key was free (now
   * held by `value`, which the scripts read as another request's record: a conflict), `same` when `value` holds
   * it, `conflict` when a record or another claim does.
   */
  claim(key: string, value: string, ttlMs: number, now: number, peekOnly: boolean): RecordClaim {
    const held = this.#records.live(key, now);
    if (held !== undefined)
      return held.reply === undefined && held.fingerprint === value ? 'same' : 'conflict';
    if (!peekOnly)
      this.#records.set(key, { fingerprint: value, reply: undefined, expiresAt: now + ttlMs * 1000 });
    return 'new';
  }

  /**
   * Keep `reply` under the request's key for its TTL, from `now` (µs), when it admitted and was not a dry run: a
   * refusal charged nothing, so a retry with the same key is decided afresh. True when it was kept.
   */
  keep(spec: RecordSpec, fingerprint: string, reply: R, now: number, dryRun: boolean | undefined): boolean {
    if (dryRun === true || !reply.allowed) return false;
    this.#records.set(spec.key, { fingerprint, reply, expiresAt: now + spec.ttlMs * 1000 });
    return true;
  }

  /** Delete the record under `key`; true when a live one was there (as a refund script reports it). */
  forget(key: string, now: number): boolean {
    return this.#records.delete(key, now);
  }

  /** Keys of the live records at `now` (µs). */
  keys(now: number): string[] {
    return this.#records.keys(now);
  }
}
