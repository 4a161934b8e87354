/**
 * The sliding-log case table: every case runs against the reference model (core/models/sliding-log.ts) and against
 * `lua/sliding_log.lua` on a real Redis, and the two must return identical replies and hold identical entries.
 * Steps carry virtual time (`at`, ms since the case began); `expect` pins the numbers we promise.
 */
import type { LogRequest } from '../../core/models/sliding-log.js';
import { logRecordKey } from '../../core/models/sliding-log.js';
import { mismatches } from '../helpers/case-runner.js';

export interface LogCaseCheck {
  log: string;
  limit: number;
  windowMs: number;
  cost?: number;
  /** Default: the window. */
  ttlMs?: number;
}

export interface LogCaseStep {
  at: number;
  checks: LogCaseCheck[];
  dryRun?: boolean;
  idempotencyKey?: string;
  /** Repeat n times at the same instant (default 1); `expect` applies to the last. */
  repeat?: number;
  expect?:
    | {
        allowed?: boolean;
        replayed?: boolean;
        conflict?: boolean;
        remaining?: number[];
        retryAfterMs?: (number | null)[];
        resetMs?: number[];
        /** Sequence number of the first entry each log wrote (0 when none). */
        seq?: number[];
        /** Entries each log holds after the step. */
        entries?: number[];
      }
    | undefined;
}

export interface LogCase {
  name: string;
  steps: LogCaseStep[];
}

/** Virtual Redis time at which every case starts, in µs. */
export const LOG_CASE_EPOCH_MICROS = 1_750_000_000_000_000;

const five = { log: 'a', limit: 5, windowMs: 10_000 };
const other = { log: 'b', limit: 2, windowMs: 10_000 };

export const slidingLogCases: LogCase[] = [
  {
    name: 'a new log admits; remaining counts down; reset is one window',
    steps: [
      {
        at: 0,
        checks: [five],
        expect: { allowed: true, remaining: [4], retryAfterMs: [0], resetMs: [10_000], entries: [1] },
      },
    ],
  },
  {
    name: 'five in any rolling window: the sixth waits until the oldest leaves',
    steps: [
      { at: 0, checks: [five] },
      { at: 1000, checks: [five] },
      { at: 2000, checks: [five] },
      { at: 3000, checks: [five] },
      { at: 4000, checks: [five], expect: { allowed: true, remaining: [0] } },
      {
        at: 5000,
        checks: [five],
        expect: { allowed: false, remaining: [0], retryAfterMs: [5000], resetMs: [9000], entries: [5] },
      },
    ],
  },
  {
    name: 'an entry leaves at exactly its stamp plus the window, not a microsecond before',
    steps: [
      { at: 0, checks: [five], repeat: 5 },
      { at: 9999.999, checks: [five], expect: { allowed: false, retryAfterMs: [1] } },
      { at: 10_000, checks: [five], expect: { allowed: true, remaining: [4], entries: [1] } },
    ],
  },
  {
    name: 'no burst at a window edge: a fixed window would admit ten here, the log admits five',
    steps: [
      { at: 9000, checks: [five], repeat: 5 },
      { at: 11_000, checks: [five], repeat: 5, expect: { allowed: false, retryAfterMs: [8000] } },
    ],
  },
  {
    name: 'a cost of n takes n units; the wait is for the entry whose leaving makes room',
    steps: [
      { at: 0, checks: [{ ...five, cost: 2 }] },
      { at: 1000, checks: [{ ...five, cost: 2 }], expect: { allowed: true, remaining: [1], entries: [4] } },
      { at: 2000, checks: [{ ...five, cost: 3 }], expect: { allowed: false, retryAfterMs: [8000] } },
      { at: 2000, checks: [{ ...five, cost: 1 }], expect: { allowed: true, remaining: [0] } },
    ],
  },
  {
    name: 'a cost above the limit never fits',
    steps: [
      {
        at: 0,
        checks: [{ ...five, cost: 6 }],
        expect: { allowed: false, remaining: [5], retryAfterMs: [null], resetMs: [0], entries: [0] },
      },
      {
        at: 0,
        checks: [{ log: 'z', limit: 0, windowMs: 1000 }],
        expect: { allowed: false, retryAfterMs: [null] },
      },
    ],
  },
  {
    name: 'layered logs are all-or-nothing: a full one writes nothing into the other',
    steps: [
      { at: 0, checks: [other], repeat: 2 },
      {
        at: 100,
        checks: [five, other],
        expect: { allowed: false, remaining: [5, 0], retryAfterMs: [0, 9900], entries: [0, 2] },
      },
    ],
  },
  {
    name: 'a dry run decides but writes nothing',
    steps: [
      {
        at: 0,
        checks: [five],
        dryRun: true,
        repeat: 7,
        expect: { allowed: true, remaining: [4], entries: [0] },
      },
    ],
  },
  {
    name: 'a clock step backwards neither reopens the window nor reorders entries',
    steps: [
      { at: 5000, checks: [five], repeat: 5 },
      { at: 14_000, checks: [five], expect: { allowed: false, retryAfterMs: [1000] } },
      // Decided at the newest stamp (5000), not at 1000: the wait is counted from there, conservatively.
      { at: 1000, checks: [five], expect: { allowed: false, retryAfterMs: [10_000] } },
      { at: 15_000, checks: [five], expect: { allowed: true, entries: [1] } },
    ],
  },
  {
    name: 'a stamp clamped by a step back gets the next sequence numbers',
    steps: [
      { at: 5000, checks: [{ ...five, cost: 2 }] },
      { at: 3000, checks: [{ ...five, cost: 2 }], expect: { allowed: true, remaining: [1], entries: [4] } },
    ],
  },
  {
    // The high-water mark outlives the entries: names of entries that left the window are not issued again.
    name: 'after every entry left the window, a clock step back still stamps after the last name issued',
    steps: [
      { at: 5000, checks: [{ ...five, cost: 2, ttlMs: 60_000 }], expect: { allowed: true, seq: [0] } },
      { at: 20_000, checks: [{ ...five, cost: 6, ttlMs: 60_000 }], expect: { allowed: false, entries: [0] } },
      {
        at: 1000,
        checks: [{ ...five, ttlMs: 60_000 }],
        expect: { allowed: true, remaining: [4], seq: [2], entries: [1] },
      },
    ],
  },
  {
    name: 'a limit shrunk below what the window holds: remaining is 0 and the wait covers the excess',
    steps: [
      { at: 0, checks: [five], repeat: 5 },
      {
        at: 1000,
        checks: [{ ...five, limit: 2 }],
        expect: { allowed: false, remaining: [0], retryAfterMs: [9000] },
      },
    ],
  },
  {
    name: 'a denial trims entries that left the window but keeps the key TTL',
    steps: [
      { at: 0, checks: [{ ...five, limit: 1, ttlMs: 30_000 }] },
      { at: 20_000, checks: [{ ...five, limit: 1, ttlMs: 30_000 }] },
      {
        at: 25_000,
        checks: [{ ...five, limit: 1, ttlMs: 30_000 }],
        expect: { allowed: false, entries: [1] },
      },
      { at: 50_000, checks: [five], expect: { allowed: true, entries: [1] } },
    ],
  },
  {
    name: 'an idle log expires with its key',
    steps: [
      { at: 0, checks: [five], repeat: 5 },
      { at: 10_000, checks: [{ ...five, cost: 6 }], expect: { entries: [0] } },
    ],
  },
  {
    name: 'an idempotent retry replays the first decision and writes nothing; another request conflicts',
    steps: [
      { at: 0, checks: [five], idempotencyKey: 'k1', expect: { allowed: true, remaining: [4] } },
      {
        at: 10,
        checks: [five],
        idempotencyKey: 'k1',
        expect: { allowed: true, replayed: true, remaining: [4], entries: [1] },
      },
      {
        at: 20,
        checks: [{ ...five, cost: 2 }],
        idempotencyKey: 'k1',
        expect: { allowed: false, conflict: true, entries: [1] },
      },
    ],
  },
  {
    name: 'a refused idempotent request is decided afresh',
    steps: [
      { at: 0, checks: [other], repeat: 2 },
      { at: 10, checks: [other], idempotencyKey: 'k2', expect: { allowed: false } },
      { at: 10_000, checks: [other], idempotencyKey: 'k2', expect: { allowed: true, replayed: false } },
    ],
  },
];

/** One step as the script sees it, at its virtual instant. */
export interface PreparedLogStep {
  step: LogCaseStep;
  request: LogRequest;
  nowMicros: number;
}

/** Build a case's requests, with keys under `prefix` (one hash-tag slot). */
export function prepareLogCase(prefix: string, c: LogCase): PreparedLogStep[] {
  const out: PreparedLogStep[] = [];
  for (const step of c.steps) {
    const request: LogRequest = {
      checks: step.checks.map((k) => ({
        key: logKey(prefix, k.log),
        limit: k.limit,
        windowMs: k.windowMs,
        cost: k.cost ?? 1,
        ttlMs: k.ttlMs ?? k.windowMs,
      })),
      ...(step.dryRun === true ? { dryRun: true } : {}),
      ...(step.idempotencyKey === undefined
        ? {}
        : { idempotency: { key: logRecordKey(prefix, step.idempotencyKey), ttlMs: 3_600_000 } }),
    };
    const repeat = step.repeat ?? 1;
    for (let i = 0; i < repeat; i++) {
      const { expect: _e, ...rest } = step;
      out.push({
        step: i === repeat - 1 ? step : rest,
        request,
        nowMicros: LOG_CASE_EPOCH_MICROS + Math.round(step.at * 1000),
      });
    }
  }
  return out;
}

/** Key of a case's log. */
export function logKey(prefix: string, log: string): string {
  return `rl:log:v1:{${prefix}}:${log}`;
}

/** Mismatches between a step's expectations and a reply plus the entries held after it. */
export function checkLogExpectations(
  step: LogCaseStep,
  reply: {
    allowed: boolean;
    replayed: boolean;
    conflict: boolean;
    results: { remaining: number; retryAfterMs: number; resetMs: number; seq: number }[];
  },
  entries: number[],
): string[] {
  const e = step.expect;
  if (e === undefined) return [];
  const { problems, same } = mismatches(e, reply);
  if (e.remaining !== undefined)
    same(
      'remaining',
      e.remaining,
      reply.results.map((r) => r.remaining),
    );
  if (e.retryAfterMs !== undefined)
    same(
      'retryAfterMs',
      e.retryAfterMs,
      reply.results.map((r) => (r.retryAfterMs < 0 ? null : r.retryAfterMs)),
    );
  if (e.resetMs !== undefined)
    same(
      'resetMs',
      e.resetMs,
      reply.results.map((r) => r.resetMs),
    );
  if (e.seq !== undefined)
    same(
      'seq',
      e.seq,
      reply.results.map((r) => r.seq),
    );
  if (e.entries !== undefined) same('entries', e.entries, entries);
  return problems;
}
