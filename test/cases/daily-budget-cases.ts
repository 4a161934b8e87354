/**
 * The daily-budget case table: every case runs against the model (core/models/daily-budget.ts) and against
 * `lua/daily_budget.lua` on a real Redis, replies compared exactly. Time is virtual (`at`, ms since midnight of the
 * case's first day); every day here is 24 h except where a case passes its own bounds (a DST day of 23 h).
 */
import { dayRecordKey, type DayRequest } from '../../core/models/daily-budget.js';

/** Midnight of the case's first day, µs (a UTC midnight, a realistic epoch). */
export const DAY0 = 1_764_806_400_000_000;
const H = 3_600_000_000;
const D = 24 * H;
/** Yesterday, today, tomorrow, the day after: the boundaries an agent passes around day `k`. */
export const around = (k: number): [number, number, number, number] => [
  DAY0 + (k - 1) * D,
  DAY0 + k * D,
  DAY0 + (k + 1) * D,
  DAY0 + (k + 2) * D,
];

export interface DayCaseStep {
  /** ms since DAY0. */
  at: number;
  checks: { counter: string; limit: number; cost?: number; bounds?: [number, number, number, number] }[];
  dryRun?: boolean;
  idempotencyKey?: string;
  repeat?: number;
  expect?: {
    allowed?: boolean;
    replayed?: boolean;
    conflict?: boolean;
    remaining?: number[];
    retryAfterMs?: (number | null)[];
    resetMs?: number[];
    /** {-2}: the clock is in none of the days passed. */
    noDay?: true;
  };
}

export interface DayCase {
  name: string;
  steps: DayCaseStep[];
}

const M = 1_000_000;
const ten = { counter: 'a', limit: 10 * M, cost: M };
const HOUR_MS = 3_600_000;

export const dailyBudgetCases: DayCase[] = [
  {
    name: 'ten a day: the eleventh waits until midnight, the next day starts empty',
    steps: [
      {
        at: 1000,
        checks: [ten],
        repeat: 10,
        expect: { allowed: true, remaining: [0], resetMs: [24 * HOUR_MS - 1000] },
      },
      { at: 2000, checks: [ten], expect: { allowed: false, retryAfterMs: [24 * HOUR_MS - 2000] } },
      { at: 24 * HOUR_MS - 1, checks: [ten], expect: { allowed: false, retryAfterMs: [1] } },
      {
        at: 24 * HOUR_MS,
        checks: [{ ...ten, bounds: around(1) }],
        expect: { allowed: true, remaining: [9 * M] },
      },
    ],
  },
  {
    name: 'fractional costs count in micro-units; a cost above the limit never fits',
    steps: [
      { at: 0, checks: [{ ...ten, cost: 2_500_000 }], repeat: 4, expect: { allowed: true, remaining: [0] } },
      {
        at: 1,
        checks: [{ ...ten, counter: 'b', cost: 11 * M }],
        expect: { allowed: false, remaining: [10 * M], retryAfterMs: [null] },
      },
    ],
  },
  {
    name: 'a 23-hour DST day: the day ends at its own boundary',
    steps: [
      {
        at: 22 * HOUR_MS,
        checks: [{ ...ten, cost: 10 * M, bounds: [DAY0 - D, DAY0, DAY0 + 23 * H, DAY0 + 47 * H] }],
        expect: { allowed: true, resetMs: [HOUR_MS] },
      },
      {
        at: 23 * HOUR_MS,
        checks: [{ ...ten, bounds: [DAY0 - D, DAY0, DAY0 + 23 * H, DAY0 + 47 * H] }],
        expect: { allowed: true, remaining: [9 * M], resetMs: [24 * HOUR_MS] },
      },
    ],
  },
  {
    name: "an agent whose clock is a day behind still counts Redis time's day; two days off decides nothing",
    steps: [
      {
        at: 25 * HOUR_MS,
        checks: [{ ...ten, bounds: around(0) }],
        expect: { allowed: true, resetMs: [23 * HOUR_MS] },
      },
      { at: 49 * HOUR_MS, checks: [{ ...ten, bounds: around(0) }], expect: { noDay: true } },
    ],
  },
  {
    name: 'layered counters are all-or-nothing; a dry run writes nothing',
    steps: [
      { at: 0, checks: [{ counter: 'small', limit: 2 * M, cost: M }], repeat: 2 },
      {
        at: 1,
        checks: [ten, { counter: 'small', limit: 2 * M, cost: M }],
        expect: { allowed: false, remaining: [10 * M, 0] },
      },
      { at: 2, checks: [ten], dryRun: true, repeat: 3, expect: { allowed: true, remaining: [9 * M] } },
    ],
  },
  {
    name: 'an idempotent retry replays; another request on the key conflicts',
    steps: [
      { at: 0, checks: [ten], idempotencyKey: 'k', expect: { allowed: true, remaining: [9 * M] } },
      {
        at: 5,
        checks: [ten],
        idempotencyKey: 'k',
        expect: { allowed: true, replayed: true, remaining: [9 * M] },
      },
      { at: 6, checks: [{ ...ten, cost: 2 * M }], idempotencyKey: 'k', expect: { conflict: true } },
      { at: 7, checks: [ten], expect: { remaining: [8 * M] } },
    ],
  },
];

export interface PreparedDayStep {
  step: DayCaseStep;
  request: DayRequest;
  nowMicros: number;
}

export function dayCaseKey(prefix: string, counter: string): string {
  return `rl:day:v1:{${prefix}}:${counter}`;
}

export function prepareDayCase(prefix: string, c: DayCase): PreparedDayStep[] {
  const out: PreparedDayStep[] = [];
  for (const step of c.steps) {
    const request: DayRequest = {
      checks: step.checks.map((k) => ({
        key: dayCaseKey(prefix, k.counter),
        limit: k.limit,
        cost: k.cost ?? M,
        bounds: k.bounds ?? around(0),
      })),
      ...(step.dryRun === true ? { dryRun: true } : {}),
      ...(step.idempotencyKey === undefined
        ? {}
        : { idempotency: { key: dayRecordKey(prefix, step.idempotencyKey), ttlMs: 3_600_000 } }),
    };
    const repeat = step.repeat ?? 1;
    for (let i = 0; i < repeat; i++) {
      const { expect: _e, ...rest } = step;
      out.push({
        step: i === repeat - 1 ? step : rest,
        request,
        nowMicros: DAY0 + Math.round(step.at * 1000),
      });
    }
  }
  return out;
}

/** Mismatches between a step's expectations and a reply (or the no-day error). */
export function checkDayExpectations(
  step: DayCaseStep,
  reply:
    | {
        allowed: boolean;
        replayed: boolean;
        conflict: boolean;
        results: { remaining: number; retryAfterMs: number; resetMs: number }[];
      }
    | 'no_day',
): string[] {
  const e = step.expect;
  if (e === undefined) return [];
  if (reply === 'no_day') return e.noDay === true ? [] : ['answered no_day'];
  if (e.noDay === true) return ['decided, want no_day'];
  const problems: string[] = [];
  const same = (what: string, want: unknown, got: unknown) => {
    if (want !== undefined && JSON.stringify(want) !== JSON.stringify(got))
      problems.push(`${what}: want ${JSON.stringify(want)} got ${JSON.stringify(got)}`);
  };
  same('allowed', e.allowed, reply.allowed);
  same('replayed', e.replayed, reply.replayed);
  same('conflict', e.conflict, reply.conflict);
  same(
    'remaining',
    e.remaining,
    reply.results.map((r) => r.remaining),
  );
  same(
    'retryAfterMs',
    e.retryAfterMs,
    reply.results.map((r) => (r.retryAfterMs < 0 ? null : r.retryAfterMs)),
  );
  same(
    'resetMs',
    e.resetMs,
    reply.results.map((r) => r.resetMs),
  );
  return problems;
}
