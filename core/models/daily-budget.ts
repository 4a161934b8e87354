/**
 * Daily budgets: at most `limit` units per calendar day of an IANA time zone, counted in one Redis hash per
 * subject (`{start, used}` in micro-units). The reference model of `lua/daily_budget.lua` and
 * `lua/daily_budget_refund.lua`, their wire format, and the day boundaries.
 *
 * Day boundaries are computed here, with Intl (DST-correct: a day is 23, 24 or 25 hours long), as instants in µs:
 * the agent passes the starts of yesterday, today, tomorrow and the day after (by its clock), and the script picks
 * the day that holds Redis `TIME`, so the decision is on Redis time and an agent whose clock is off by less than a
 * day still counts in the right day.
 */
import { z } from 'zod';
import { ExpiringMap } from './expiring-map.js';
import { IdempotencyRecords, type RecordClaim } from './idempotency.js';
import { idempotencyRecordKey } from '../keys.js';
import { MAX_CAPACITY } from '../policy/limits.js';
import {
  counterCallHead,
  counterRefundArguments,
  keyCostFingerprint,
  lowestShare,
  parseCounterRefundReply,
  parseCounterReply,
} from '../wire/script.js';
import type { RegionalShare } from '../shares/shares.js';

/** Micro-units per unit (a token cost's resolution). */
export const DAY_MICRO = 1_000_000;
/** Most counters one script call may decide. */
export const MAX_DAYS_PER_CALL = 16;
const MAX_TTL_MS = 30 * 24 * 3600 * 1000;

/** Redis key of one subject's daily counter: `rl:day:v{version}:{subject}:{policy}`, in the subject's slot. */
export function dailyKey(version: number, subject: string, policy: string): string {
  return `rl:day:v${version}:{${subject}}:${policy}`;
}

/** What tells a daily call's record key from the token-bucket record's of the same subject and key. */
export const DAY_RECORD_SUFFIX = ':day';

/** Key of a daily call's idempotency record, in the subject's slot. */
export function dayRecordKey(subject: string, idempotencyKey: string): string {
  return `${idempotencyRecordKey(subject, idempotencyKey)}${DAY_RECORD_SUFFIX}`;
}

const formatters = new Map<string, Intl.DateTimeFormat>();

/** The local calendar date of `ms` in `zone`, as a number YYYYMMDD (ordered as dates are). */
function localDate(zone: string, ms: number): number {
  let f = formatters.get(zone);
  if (f === undefined) {
    f = new Intl.DateTimeFormat('en-US', {
      timeZone: zone,
      year: 'numeric',
      month: 'numeric',
      day: 'numeric',
      era: 'short',
    });
    formatters.set(zone, f);
  }
  let y = 0;
  let m = 0;
  let d = 0;
  for (const part of f.formatToParts(ms)) {
    if (part.type === 'year') y = Number(part.value);
    else if (part.type === 'month') m = Number(part.value);
    else if (part.type === 'day') d = Number(part.value);
  }
  return y * 10_000 + m * 100 + d;
}

/**
 * The first millisecond at or after `from` whose local date is later than `date`: the start of the next local
 * day. Offsets are within ±18 h, so it lies within 48 h; a binary search over that span (local dates only grow
 * with time but for the rare zone whose clocks go back across midnight, where the first crossing is taken).
 */
function nextDayStart(zone: string, from: number, date: number): number {
  let lo = from;
  let hi = from + 48 * 3600 * 1000;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (localDate(zone, mid) > date) hi = mid;
    else lo = mid;
  }
  return hi;
}

type DayBounds = { from: number; to: number; bounds: [number, number, number, number] };
/** Days found per zone, the latest first: a clock that moves between a few days finds each again. */
const cache = new Map<string, DayBounds[]>();
/** Days kept per zone (each search costs some two hundred local-date conversions). */
const CACHED_DAYS = 4;

/**
 * Starts of yesterday, today, tomorrow and the day after in `zone`, in ms, for the day holding `nowMs`. Cached per
 * zone, the last few days found.
 */
export function dayBoundariesMs(zone: string, nowMs: number): [number, number, number, number] {
  const days = cache.get(zone) ?? [];
  const hit = days.find((d) => nowMs >= d.from && nowMs < d.to);
  if (hit !== undefined) return hit.bounds;
  const today = localDate(zone, nowMs);
  // Today began within the last 27 h (the longest day is 25 h); search forward from 50 h ago for each start.
  const yesterdayStart = nextDayStart(
    zone,
    nowMs - 50 * 3600 * 1000,
    localDate(zone, nowMs - 50 * 3600 * 1000),
  );
  let starts = [yesterdayStart];
  while (starts.length < 8) {
    const last = starts[starts.length - 1]!;
    starts.push(nextDayStart(zone, last, localDate(zone, last)));
  }
  // Keep the four starts around today: the last one at or before now, one before it, and two after.
  const i = starts.findIndex((s, k) => s <= nowMs && (starts[k + 1] ?? Infinity) > nowMs);
  starts = starts.slice(Math.max(0, i - 1), Math.max(0, i - 1) + 4);
  if (localDate(zone, starts[1]!) !== today) throw new RangeError(`no day boundary found for ${zone}`);
  const bounds = starts as [number, number, number, number];
  cache.set(zone, [{ from: bounds[1], to: bounds[2], bounds }, ...days.slice(0, CACHED_DAYS - 1)]);
  return bounds;
}

/** One daily counter to check. */
export const DayCheck = z.strictObject({
  key: z.string().min(1).max(512),
  /** Micro-units admitted per day (this region's share). */
  limit: z
    .number()
    .int()
    .min(0)
    .max(MAX_CAPACITY * DAY_MICRO),
  /** Micro-units this request costs. */
  cost: z
    .number()
    .int()
    .min(1)
    .max(MAX_CAPACITY * DAY_MICRO),
  /** Starts of yesterday, today, tomorrow and the day after, µs, ascending. */
  bounds: z.tuple([z.number().int(), z.number().int(), z.number().int(), z.number().int()]),
});
export type DayCheck = z.infer<typeof DayCheck>;

/** One call: counters of one slot decided all-or-nothing, with an optional idempotency record in that slot. */
export const DayRequest = z
  .strictObject({
    checks: z.array(DayCheck).min(1).max(MAX_DAYS_PER_CALL),
    idempotency: z
      .strictObject({ key: z.string().min(1).max(512), ttlMs: z.number().int().min(1).max(MAX_TTL_MS) })
      .optional(),
    dryRun: z.boolean().optional(),
  })
  .superRefine((r, ctx) => {
    r.checks.forEach((c, i) => {
      const [a, b, d, e] = c.bounds;
      if (!(a > 0 && a < b && b < d && d < e))
        ctx.addIssue({ code: 'custom', path: ['checks', i, 'bounds'], message: 'bounds must ascend' });
    });
  });
export type DayRequest = z.infer<typeof DayRequest>;

/** One counter's decision. */
export interface DayResult {
  allowed: boolean;
  /** Micro-units still admissible today (after this call's, when admitted). */
  remaining: number;
  /** Ms until the cost fits (the day's end); 0 when it fits; -1 when it never can (cost above limit). */
  retryAfterMs: number;
  /** Ms until the day ends. */
  resetMs: number;
  /** µs start of the day this call charged, 0 when it charged nothing: what a refund names. */
  start: number;
}

export interface DayReply {
  allowed: boolean;
  replayed: boolean;
  conflict: boolean;
  results: DayResult[];
}

/** What an admitted call charged, to take back. */
export interface DayRefund {
  keys: string[];
  entries: { start: number; cost: number }[];
  recordKey?: string | undefined;
}

/** A daily call's reply to a request whose clock is outside every day it was given. */
export class DayWindowError extends Error {
  readonly code = 'QP_NO_DAY';
  constructor() {
    super("Redis time is outside the days the agent passed: the agent's clock is more than a day off");
    this.name = 'DayWindowError';
  }
}

export function parseDayRequest(input: DayRequest): DayRequest {
  return DayRequest.parse(input);
}

/** SHA-1 of a request's keys and costs, as the script computes it. */
export function dayFingerprint(request: DayRequest): string {
  return keyCostFingerprint(request.checks);
}

/** KEYS and ARGV of `lua/daily_budget.lua` (deadline: µs of Redis time, 0 = none). */
export function dayArguments(request: DayRequest, deadline = 0): { keys: string[]; argv: string[] } {
  const { keys, argv } = counterCallHead(request, deadline);
  for (const c of request.checks) argv.push(String(c.limit), String(c.cost), ...c.bounds.map(String));
  return { keys, argv };
}

/** KEYS and ARGV of `lua/daily_budget_refund.lua`. */
export function dayRefundArguments(refund: DayRefund): { keys: string[]; argv: string[] } {
  return counterRefundArguments(refund, (e) => [e.start, e.cost]);
}

/** Parse the script's flat integer reply for `checks` counters. */
export function parseDayReply(reply: unknown, checks: number): DayReply {
  if (Array.isArray(reply) && reply.length === 1 && reply[0] === -2) throw new DayWindowError();
  return parseCounterReply(reply, checks, 5, 'daily-budget reply', (v, at) => ({
    allowed: v[at] === 1,
    remaining: v[at + 1]!,
    retryAfterMs: v[at + 2]!,
    resetMs: v[at + 3]!,
    start: v[at + 4]!,
  }));
}

/** Parse the refund script's reply: per counter, micro-units given back; then 1 when the record was deleted. */
export function parseDayRefundReply(
  reply: unknown,
  checks: number,
): { refunded: number[]; recordDeleted: boolean } {
  const { counts, recordDeleted } = parseCounterRefundReply(reply, checks, 'daily-budget refund reply');
  return { refunded: counts, recordDeleted };
}

/** A region's daily limit in micro-units at share `share`: floor(capacity × share), to the micro-unit. */
export function dayLimitMicros(capacity: number, share: number): number {
  return Math.max(0, Math.floor(capacity * share * DAY_MICRO + 1e-3));
}

/**
 * The daily counter a region enforces: floor(capacity × the lowest share in force over the last idle TTL (a
 * day)) in micro-units, so the regions' counters never sum above the budget within one day, and the day's
 * boundaries in the policy's zone at `nowMs` (the agent's clock).
 */
export function sizedDay(
  policy: { capacity: number; timeZone?: string | undefined },
  key: string,
  cost: number,
  share: RegionalShare | number,
  nowMs: number,
): DayCheck {
  const s = lowestShare(share);
  const bounds = dayBoundariesMs(policy.timeZone ?? 'UTC', nowMs).map(
    (ms) => ms * 1000,
  ) as DayCheck['bounds'];
  return {
    key,
    limit: dayLimitMicros(policy.capacity, s),
    cost: Math.round(cost * DAY_MICRO),
    bounds,
  };
}

interface StoredCounter {
  start: number;
  used: number;
  /** µs at which the key expires. */
  expiresAt: number;
}

/** An in-memory Redis holding daily counters and their idempotency records, as the scripts do. */
export class DailyBudgetModel {
  readonly #counters = new ExpiringMap<StoredCounter>();
  readonly #records = new IdempotencyRecords<DayReply>();

  /** A claim of the record key `key` at `now` (µs), as Redis answers it (`IdempotencyRecords.claim`). */
  claimRecord(key: string, value: string, ttlMs: number, now: number, peekOnly: boolean): RecordClaim {
    return this.#records.claim(key, value, ttlMs, now, peekOnly);
  }

  /** Decide one call at `now` (µs), step for step as `lua/daily_budget.lua`. */
  evaluate(request: DayRequest, now: number): DayReply {
    const { idempotency } = request;
    const dry = request.dryRun === true;
    const fingerprint = idempotency === undefined ? '' : dayFingerprint(request);
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
            start: 0,
          })),
        };
      }
    }
    const views = request.checks.map((c) => {
      const [, , , last] = c.bounds;
      let w = -1;
      for (let k = 0; k < 3; k++) if (c.bounds[k]! <= now && now < c.bounds[k + 1]!) w = k;
      if (w < 0 || now >= last) return undefined;
      const start = c.bounds[w]!;
      const end = c.bounds[w + 1]!;
      const stored = this.#counters.live(c.key, now);
      const used = stored !== undefined && stored.start === start ? stored.used : 0;
      return { start, end, used, fits: used + c.cost <= c.limit };
    });
    if (views.some((v) => v === undefined)) throw new DayWindowError();
    const allowed = views.every((v) => v!.fits);
    const results = request.checks.map((c, i): DayResult => {
      const { start, end, used, fits } = views[i]!;
      const write = allowed && !dry;
      const resetMs = Math.ceil((end - now) / 1000);
      if (write) {
        this.#counters.set(c.key, { start, used: used + c.cost, expiresAt: now + (resetMs + 60_000) * 1000 });
      }
      return {
        allowed,
        remaining: Math.max(0, c.limit - used - (allowed ? c.cost : 0)),
        retryAfterMs: fits ? 0 : c.cost > c.limit ? -1 : resetMs,
        resetMs,
        start: write ? start : 0,
      };
    });
    const reply: DayReply = { allowed, replayed: false, conflict: false, results };
    if (idempotency !== undefined) this.#records.keep(idempotency, fingerprint, reply, now, dry);
    return reply;
  }

  /** Take back what an admitted call charged, as `lua/daily_budget_refund.lua` does. */
  refund(refund: DayRefund, now: number): { refunded: number[]; recordDeleted: boolean } {
    const refunded = refund.entries.map((e, i) => {
      const stored = this.#counters.live(refund.keys[i]!, now);
      if (stored === undefined || stored.start !== e.start) return 0;
      const back = Math.min(stored.used, e.cost);
      stored.used -= back;
      return back;
    });
    const recordDeleted = refund.recordKey !== undefined && this.#records.forget(refund.recordKey, now);
    return { refunded, recordDeleted };
  }

  /** Micro-units used today under `key` at `now` (0 when none). */
  used(key: string, now: number): number {
    return this.#counters.live(key, now)?.used ?? 0;
  }
}
