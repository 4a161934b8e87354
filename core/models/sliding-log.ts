/**
 * Sliding-log limits: at most `limit` units of cost in any rolling window, kept exactly as one sorted-set entry
 * per admitted unit (score: µs of Redis time). The reference model of `lua/sliding_log.lua` and
 * `lua/sliding_log_refund.lua`, their wire format, and the rule that sizes a region's limit from its share.
 *
 * Units are the scripts': time in microseconds, costs and limits in whole events. An entry admitted at `t`
 * counts while `now - window < t`, i.e. it leaves the window at exactly `t + window`.
 */
import { z } from 'zod';
import { validStoreRequest } from '../wire/bucket.js';
import { ExpiringMap } from './expiring-map.js';
import { IdempotencyRecords, type RecordClaim } from './idempotency.js';
import { idempotencyRecordKey } from '../keys.js';
import { MAX_WINDOW_SECONDS } from '../kinds/sliding-log/schema.js';
import { MAX_LOG_LIMIT } from '../policy/limits.js';
import type { SizedPolicyFields } from '../kinds/kind.js';
import {
  counterCallHead,
  counterRefundArguments,
  keyCostFingerprint,
  lowestShare,
  parseCounterRefundReply,
  parseCounterReply,
} from '../wire/script.js';
import type { RegionalShare } from '../shares/shares.js';

/** Most logs one script call may decide (the same bound as token buckets). */
export const MAX_LOGS_PER_CALL = 16;
/** Longest TTL of a log key or idempotency record: 30 days. */
const MAX_TTL_MS = 30 * 24 * 3600 * 1000;

/**
 * Redis key of one subject's log of one policy: `rl:log:v{version}:{subject}:{policy}`, in the subject's slot
 * (hash tag) like its buckets, but never the same key, so a policy whose kind changes meets no foreign type.
 */
export function slidingLogKey(version: number, subject: string, policy: string): string {
  return `rl:log:v${version}:{${subject}}:${policy}`;
}

/** What tells a log call's record key from the token-bucket record's of the same subject and key. */
export const LOG_RECORD_SUFFIX = ':log';

/** Key of a log call's idempotency record: the subject's slot, apart from the token-bucket record. */
export function logRecordKey(subject: string, idempotencyKey: string): string {
  return `${idempotencyRecordKey(subject, idempotencyKey)}${LOG_RECORD_SUFFIX}`;
}

/** One log to check. */
export const LogCheck = z.strictObject({
  key: z.string().min(1).max(512),
  /** Units admitted in any rolling window (the region's share of the policy's limit); 0 admits nothing. */
  limit: z.number().int().min(0).max(MAX_LOG_LIMIT),
  /** Rolling window in ms. */
  windowMs: z
    .number()
    .int()
    .min(1)
    .max(MAX_WINDOW_SECONDS * 1000),
  /** Units this request costs (whole events). */
  cost: z.number().int().min(1).max(MAX_LOG_LIMIT),
  /** TTL of the key after a write, ms; at least the window. */
  ttlMs: z.number().int().min(1).max(MAX_TTL_MS),
});
export type LogCheck = z.infer<typeof LogCheck>;

/** One call: logs of one slot decided all-or-nothing, with an optional idempotency record in that slot. */
export const LogRequest = z
  .strictObject({
    checks: z.array(LogCheck).min(1).max(MAX_LOGS_PER_CALL),
    idempotency: z
      .strictObject({ key: z.string().min(1).max(512), ttlMs: z.number().int().min(1).max(MAX_TTL_MS) })
      .optional(),
    dryRun: z.boolean().optional(),
  })
  .superRefine((r, ctx) => {
    r.checks.forEach((c, i) => {
      if (c.ttlMs < c.windowMs)
        ctx.addIssue({ code: 'custom', path: ['checks', i, 'ttlMs'], message: 'ttlMs must be ≥ windowMs' });
    });
  });
export type LogRequest = z.infer<typeof LogRequest>;

/** One log's decision. */
export interface LogResult {
  /** True when the call admitted and this log was written. */
  allowed: boolean;
  /** Units still admissible now (after this call's, when admitted); never below 0. */
  remaining: number;
  /** Ms until the cost fits; 0 when it does; -1 when it never can (cost above limit). */
  retryAfterMs: number;
  /** Ms until the window holds no entry; 0 when empty. */
  resetMs: number;
  /** µs stamp of the entries this call wrote (their score), 0 when none: what a refund names. */
  stamp: number;
  /** Sequence number of the first entry written at `stamp`. */
  seq: number;
}

/** What one call answers. */
export interface LogReply {
  allowed: boolean;
  /** The idempotency record answered: the first decision, nothing written. */
  replayed: boolean;
  /** The idempotency key answers another request: nothing decided, every result zero. */
  conflict: boolean;
  results: LogResult[];
}

/** Entries written by an admitted call, to take back when a later part of the request denied. */
export interface LogRefund {
  keys: string[];
  entries: { stamp: number; seq: number; cost: number }[];
  recordKey?: string | undefined;
}

/** Validate a request; throws an InvalidBucketRequestError listing every problem. */
export function parseLogRequest(input: LogRequest): LogRequest {
  return validStoreRequest(LogRequest, input);
}

/** Member of one entry: stamp and a zero-padded sequence, so members of one stamp sort by sequence. */
export function entryMember(stamp: number, seq: number): string {
  return `${String(stamp)}:${String(seq).padStart(9, '0')}`;
}

function seqOf(member: string): number {
  return Number(member.slice(member.indexOf(':') + 1));
}

/**
 * Member of a log's high-water mark (score -inf): the last entry name the log issued, `~<stamp>:<seq>`. Never an
 * entry's member (those start with a digit), so no count, trim, lookup or refund takes it for one.
 */
export function markMember(stamp: number, seq: number): string {
  return `~${String(stamp)}:${String(seq)}`;
}

/** SHA-1 of a request's log keys and costs, as the script computes it. */
export function logFingerprint(request: LogRequest): string {
  return keyCostFingerprint(request.checks);
}

/** KEYS and ARGV of `lua/sliding_log.lua` (deadline: µs of Redis time, 0 = none). */
export function logArguments(request: LogRequest, deadline = 0): { keys: string[]; argv: string[] } {
  const { keys, argv } = counterCallHead(request, deadline);
  for (const c of request.checks) {
    argv.push(String(c.limit), String(c.windowMs * 1000), String(c.cost), String(c.ttlMs));
  }
  return { keys, argv };
}

/** KEYS and ARGV of `lua/sliding_log_refund.lua`. */
export function logRefundArguments(refund: LogRefund): { keys: string[]; argv: string[] } {
  return counterRefundArguments(refund, (e) => [e.stamp, e.seq, e.cost]);
}

/** Parse the script's flat integer reply for `checks` logs; throws when its shape is not the documented one. */
export function parseLogReply(reply: unknown, checks: number): LogReply {
  return parseCounterReply(reply, checks, 6, 'sliding-log reply', (v, at) => ({
    allowed: v[at] === 1,
    remaining: v[at + 1]!,
    retryAfterMs: v[at + 2]!,
    resetMs: v[at + 3]!,
    stamp: v[at + 4]!,
    seq: v[at + 5]!,
  }));
}

/** Parse the refund script's reply: per log, entries removed; then 1 when the record was deleted. */
export function parseLogRefundReply(
  reply: unknown,
  checks: number,
): { removed: number[]; recordDeleted: boolean } {
  const { counts, recordDeleted } = parseCounterRefundReply(reply, checks, 'sliding-log refund reply');
  return { removed: counts, recordDeleted };
}

/**
 * The limit a region enforces from its share: floor(limit × the lowest share in force over the window), so the
 * regions' limits never sum above the policy's. (Entries admitted under a smaller share stay in the window; a
 * share that rose is used in full only once the window has passed.) The 1e-9 absorbs products such as
 * 100 × 0.29 = 28.999999999999996, shares being rounded to 4 decimals.
 */
export function sizedLog(
  policy: Pick<SizedPolicyFields, 'capacity' | 'windowSeconds' | 'leaseSeconds' | 'idleTtlSeconds'>,
  key: string,
  cost: number,
  share: RegionalShare | number,
): LogCheck {
  const s = lowestShare(share);
  // The window is the one window field the policy has: the schema gives each log kind only its own
  // (`windowSeconds` of a sliding log, `leaseSeconds` of a concurrency policy: core/kinds/<kind>/traits.ts `window`).
  const windowMs = (policy.windowSeconds ?? policy.leaseSeconds ?? 1) * 1000;
  return {
    key,
    limit: Math.max(0, Math.floor(policy.capacity * s + 1e-9)),
    windowMs,
    cost,
    ttlMs: Math.max(windowMs, policy.idleTtlSeconds * 1000),
  };
}

interface StoredLog {
  /** Entries in ascending (score, member) order. */
  entries: { score: number; member: string }[];
  /**
   * The high-water mark (the script's member of score -inf): the last (stamp, seq) issued, kept when the entries
   * that held it leave or are released, so no entry name is issued twice while the key lives. Absent on a log that
   * never admitted (or, on Redis, one written before the mark existed).
   */
  mark?: { stamp: number; seq: number } | undefined;
  /** µs at which the key expires. */
  expiresAt: number;
}

const msUp = (us: number): number => Math.ceil(us / 1000);

/**
 * An in-memory Redis holding logs and their idempotency records as the scripts do, TTLs included: the model the
 * Lua must agree with, and the log store of unit tests.
 */
export class SlidingLogModel {
  readonly #logs = new ExpiringMap<StoredLog>();
  readonly #records = new IdempotencyRecords<LogReply>();

  /** A claim of the record key `key` at `now` (µs), as Redis answers it (`IdempotencyRecords.claim`). */
  claimRecord(key: string, value: string, ttlMs: number, now: number, peekOnly: boolean): RecordClaim {
    return this.#records.claim(key, value, ttlMs, now, peekOnly);
  }

  /** Decide one call at `now` (µs), step for step as `lua/sliding_log.lua`. */
  evaluate(request: LogRequest, now: number): LogReply {
    const { idempotency } = request;
    const dry = request.dryRun === true;
    const fingerprint = idempotency === undefined ? '' : logFingerprint(request);
    if (idempotency !== undefined) {
      const recalled = this.#records.recall(idempotency.key, fingerprint, now);
      if (recalled !== undefined && recalled !== 'conflict') return { ...recalled.replay, replayed: true };
      if (recalled === 'conflict') {
        return {
          allowed: false,
          replayed: false,
          conflict: true,
          results: request.checks.map(() => ({
            allowed: false,
            remaining: 0,
            retryAfterMs: 0,
            resetMs: 0,
            stamp: 0,
            seq: 0,
          })),
        };
      }
    }
    const views = request.checks.map((c) => {
      const log = this.#logs.live(c.key, now);
      const entries = log?.entries ?? [];
      const newest = entries[entries.length - 1];
      const mark = log?.mark;
      const t = Math.max(now, newest?.score ?? now, mark?.stamp ?? now);
      // The next name after the newest entry's and after the mark's (the mark outlives released entries).
      let seq = newest !== undefined && newest.score === t ? seqOf(newest.member) + 1 : 0;
      if (mark !== undefined && mark.stamp === t) seq = Math.max(seq, mark.seq + 1);
      const inWindow = entries.filter((e) => e.score > t - c.windowMs * 1000);
      return { t, seq, inWindow, fits: inWindow.length + c.cost <= c.limit };
    });
    const allowed = views.every((v) => v.fits);
    const results = request.checks.map((c, i): LogResult => {
      const { t, seq, inWindow, fits } = views[i]!;
      const window = c.windowMs * 1000;
      const count = inWindow.length;
      const write = allowed && !dry;
      let retryAfterMs = 0;
      if (!fits) {
        retryAfterMs =
          c.cost > c.limit ? -1 : msUp(inWindow[count + c.cost - c.limit - 1]!.score + window - t);
      }
      const newest = allowed ? t : inWindow[count - 1]?.score;
      const resetMs = newest === undefined ? 0 : msUp(newest + window - t);
      if (!dry) {
        const kept = [...inWindow];
        if (write) for (let k = 0; k < c.cost; k++) kept.push({ score: t, member: entryMember(t, seq + k) });
        const old = this.#logs.live(c.key, now);
        // A write without admission only trims: it leaves the key's TTL and mark as they were, and drops a key
        // left with neither entries nor mark. An admission replaces the mark by the last name it wrote.
        const expiresAt = write ? t + c.ttlMs * 1000 : (old?.expiresAt ?? 0);
        const mark = write ? { stamp: t, seq: seq + c.cost - 1 } : old?.mark;
        if (kept.length === 0 && mark === undefined) this.#logs.delete(c.key, now);
        else if (write || old !== undefined) this.#logs.set(c.key, { entries: kept, mark, expiresAt });
      }
      return {
        allowed,
        remaining: Math.max(0, c.limit - count - (allowed ? c.cost : 0)),
        retryAfterMs,
        resetMs,
        stamp: write ? t : 0,
        seq: write ? seq : 0,
      };
    });
    const reply: LogReply = { allowed, replayed: false, conflict: false, results };
    if (idempotency !== undefined) this.#records.keep(idempotency, fingerprint, reply, now, dry);
    return reply;
  }

  /** Take back the entries of an admitted call, as `lua/sliding_log_refund.lua` does. */
  refund(refund: LogRefund, now: number): { removed: number[]; recordDeleted: boolean } {
    const removed = refund.entries.map((e, i) => {
      const key = refund.keys[i]!;
      const log = this.#logs.live(key, now);
      if (log === undefined) return 0;
      const names = new Set<string>();
      for (let k = 0; k < e.cost; k++) names.add(entryMember(e.stamp, e.seq + k));
      const before = log.entries.length;
      log.entries = log.entries.filter((x) => !names.has(x.member));
      // The mark is no entry name: it stays, so the released names are never issued again while the key lives.
      if (log.entries.length === 0 && log.mark === undefined) this.#logs.delete(key, now);
      return before - log.entries.length;
    });
    const recordDeleted = refund.recordKey !== undefined && this.#records.forget(refund.recordKey, now);
    return { removed, recordDeleted };
  }

  /** Entries stored under `key` at `now` (expired keys count 0), in score order; the mark is not an entry. */
  entries(key: string, now: number): number[] {
    return (this.#logs.live(key, now)?.entries ?? []).map((e) => e.score);
  }

  /** Member of the high-water mark stored under `key` at `now` (`markMember`), undefined when none. */
  mark(key: string, now: number): string | undefined {
    const mark = this.#logs.live(key, now)?.mark;
    return mark === undefined ? undefined : markMember(mark.stamp, mark.seq);
  }
}
