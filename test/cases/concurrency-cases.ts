/**
 * The concurrency case table: acquires (a sliding-log call whose window is the lease TTL) and releases (the
 * refund of exactly the entries an acquire wrote), run against the model (core/models/sliding-log.ts) and against
 * `lua/sliding_log.lua` + `lua/sliding_log_refund.lua` on a real Redis, replies compared exactly.
 * Steps carry virtual time (`at`, ms since the case began).
 */
import type { LogRefund, LogReply, LogRequest } from '../../core/models/sliding-log.js';
import { LOG_CASE_EPOCH_MICROS, logKey } from './sliding-log-cases.js';

export type ConcurrencyStep =
  | {
      at: number;
      op: 'acquire';
      /** Names the lease for a later release. */
      lease?: string;
      slots: number;
      leaseMs: number;
      cost?: number;
      expect?: { allowed: boolean; remaining?: number; retryAfterMs?: number | null };
    }
  | { at: number; op: 'release'; lease: string; expect?: { removed: number } };

export interface ConcurrencyCase {
  name: string;
  steps: ConcurrencyStep[];
}

const three = { op: 'acquire' as const, slots: 3, leaseMs: 30_000 };

export const concurrencyCases: ConcurrencyCase[] = [
  {
    name: 'three slots: the fourth acquire waits for the oldest lease to run out',
    steps: [
      { ...three, at: 0, lease: 'a', expect: { allowed: true, remaining: 2 } },
      { ...three, at: 1000, lease: 'b', expect: { allowed: true, remaining: 1 } },
      { ...three, at: 2000, lease: 'c', expect: { allowed: true, remaining: 0 } },
      { ...three, at: 3000, expect: { allowed: false, remaining: 0, retryAfterMs: 27_000 } },
    ],
  },
  {
    name: 'a release gives its slot back at once, and only once',
    steps: [
      { ...three, at: 0, lease: 'a' },
      { ...three, at: 0, lease: 'b' },
      { ...three, at: 0, lease: 'c' },
      { at: 10, op: 'release', lease: 'b', expect: { removed: 1 } },
      { at: 20, op: 'release', lease: 'b', expect: { removed: 0 } },
      { ...three, at: 30, lease: 'd', expect: { allowed: true, remaining: 0 } },
      { ...three, at: 40, expect: { allowed: false } },
    ],
  },
  {
    name: "a crashed holder's slot comes back when its lease runs out, not a microsecond before",
    steps: [
      { ...three, at: 0, lease: 'a', cost: 3 },
      { ...three, at: 29_999.999, expect: { allowed: false, retryAfterMs: 1 } },
      { ...three, at: 30_000, expect: { allowed: true, remaining: 2 } },
    ],
  },
  {
    name: 'a lease of several slots is released whole; another lease of the same instant is untouched',
    steps: [
      { ...three, at: 0, lease: 'a', cost: 2 },
      { ...three, at: 0, lease: 'b', expect: { allowed: true, remaining: 0 } },
      { at: 5, op: 'release', lease: 'a', expect: { removed: 2 } },
      { ...three, at: 6, cost: 2, expect: { allowed: true, remaining: 0 } },
      { at: 7, op: 'release', lease: 'b', expect: { removed: 1 } },
    ],
  },
  {
    name: 'more slots than the region holds never fit',
    steps: [{ ...three, at: 0, cost: 4, expect: { allowed: false, remaining: 3, retryAfterMs: null } }],
  },
];

/** What one step sends to the store: an acquire (a log request) or a release (a log refund). */
export type PreparedConcurrencyStep =
  | { step: ConcurrencyStep & { op: 'acquire' }; request: LogRequest; nowMicros: number }
  | { step: ConcurrencyStep & { op: 'release' }; release: (leases: Map<string, LogRefund>) => LogRefund };

/** The key of a case's slots. */
export function slotsKey(prefix: string): string {
  return logKey(prefix, 'slots');
}

export function prepareConcurrencyCase(prefix: string, c: ConcurrencyCase): PreparedConcurrencyStep[] {
  const key = slotsKey(prefix);
  return c.steps.map((step) => {
    if (step.op === 'release') {
      return {
        step,
        release: (leases) => {
          const held = leases.get(step.lease);
          if (held === undefined) throw new Error(`lease ${step.lease} was never acquired`);
          return held;
        },
      };
    }
    return {
      step,
      request: {
        checks: [
          { key, limit: step.slots, windowMs: step.leaseMs, cost: step.cost ?? 1, ttlMs: step.leaseMs },
        ],
      },
      nowMicros: LOG_CASE_EPOCH_MICROS + Math.round(step.at * 1000),
    };
  });
}

/** Remember the lease an acquire wrote under its name, as the agent's token does. */
export function rememberLease(
  leases: Map<string, LogRefund>,
  step: ConcurrencyStep & { op: 'acquire' },
  request: LogRequest,
  reply: LogReply,
): void {
  const r = reply.results[0];
  if (step.lease === undefined || !reply.allowed || r === undefined) return;
  leases.set(step.lease, {
    keys: [request.checks[0]!.key],
    entries: [{ stamp: r.stamp, seq: r.seq, cost: request.checks[0]!.cost }],
  });
}

/** Mismatches between an acquire's expectations and its reply. */
export function checkAcquire(step: ConcurrencyStep & { op: 'acquire' }, reply: LogReply): string[] {
  const e = step.expect;
  const r = reply.results[0]!;
  const problems: string[] = [];
  if (e === undefined) return problems;
  if (e.allowed !== reply.allowed) problems.push(`allowed: want ${e.allowed} got ${reply.allowed}`);
  if (e.remaining !== undefined && e.remaining !== r.remaining)
    problems.push(`remaining: want ${e.remaining} got ${r.remaining}`);
  const retry = r.retryAfterMs < 0 ? null : r.retryAfterMs;
  if (e.retryAfterMs !== undefined && e.retryAfterMs !== retry)
    problems.push(`retryAfterMs: want ${e.retryAfterMs} got ${retry}`);
  return problems;
}
