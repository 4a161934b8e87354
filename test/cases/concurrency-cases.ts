/**
 * The concurrency case table: acquires (a sliding-log call whose window is the lease TTL) and releases (the
 * refund of exactly the entries an acquire wrote), run against the model (core/models/sliding-log.ts) and against
 * `lua/sliding_log.lua` + `lua/sliding_log_refund.lua` on a real Redis, replies compared exactly.
 * Steps carry virtual time (`at`, ms since the case began). Every admitted acquire must name entries no earlier
 * acquire of its case named (`rememberLease` throws otherwise): a lease token is never handed out twice.
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
  {
    // Redis time behind the newest stamp (a failover to a replica whose clock is behind): every acquire is
    // stamped 5000. c must not get the name b's released entry had, else b's retried release would free c's slot.
    name: "with the clock behind, a released lease's entry names are never issued again; its retried release takes nothing",
    steps: [
      {
        op: 'acquire',
        slots: 2,
        leaseMs: 30_000,
        at: 5000,
        lease: 'a',
        expect: { allowed: true, remaining: 1 },
      },
      {
        op: 'acquire',
        slots: 2,
        leaseMs: 30_000,
        at: 1000,
        lease: 'b',
        expect: { allowed: true, remaining: 0 },
      },
      { at: 1000, op: 'release', lease: 'b', expect: { removed: 1 } },
      {
        op: 'acquire',
        slots: 2,
        leaseMs: 30_000,
        at: 1000,
        lease: 'c',
        expect: { allowed: true, remaining: 0 },
      },
      { at: 1000, op: 'release', lease: 'b', expect: { removed: 0 } },
      { op: 'acquire', slots: 2, leaseMs: 30_000, at: 1000, expect: { allowed: false, remaining: 0 } },
      // Every lease released: the mark still keeps the next acquire off the names a and c had.
      { at: 1000, op: 'release', lease: 'a', expect: { removed: 1 } },
      { at: 1000, op: 'release', lease: 'c', expect: { removed: 1 } },
      {
        op: 'acquire',
        slots: 2,
        leaseMs: 30_000,
        at: 1000,
        lease: 'd',
        expect: { allowed: true, remaining: 1 },
      },
      { at: 1000, op: 'release', lease: 'a', expect: { removed: 0 } },
      { at: 1000, op: 'release', lease: 'c', expect: { removed: 0 } },
      { op: 'acquire', slots: 2, leaseMs: 30_000, at: 1000, lease: 'e', cost: 2, expect: { allowed: false } },
    ],
  },
  {
    name: 'in the same microsecond, a released lease of several slots leaves its names unused',
    steps: [
      { ...three, at: 0, lease: 'a' },
      { ...three, at: 0, lease: 'b', cost: 2, expect: { allowed: true, remaining: 0 } },
      { at: 0, op: 'release', lease: 'b', expect: { removed: 2 } },
      { ...three, at: 0, lease: 'c', cost: 2, expect: { allowed: true, remaining: 0 } },
      { at: 0, op: 'release', lease: 'b', expect: { removed: 0 } },
      { ...three, at: 0, expect: { allowed: false } },
    ],
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

/**
 * Remember the lease an acquire wrote under its name, as the agent's token does (an unnamed one under `#<n>`,
 * never released). Throws when its entries share a name with those of any earlier lease of the case, released or
 * not: two leases naming one entry let a retried release of the first free the second's slot.
 */
export function rememberLease(
  leases: Map<string, LogRefund>,
  step: ConcurrencyStep & { op: 'acquire' },
  request: LogRequest,
  reply: LogReply,
): void {
  const r = reply.results[0];
  if (!reply.allowed || r === undefined) return;
  const cost = request.checks[0]!.cost;
  for (const [name, held] of leases) {
    const e = held.entries[0]!;
    if (e.stamp === r.stamp && e.seq < r.seq + cost && r.seq < e.seq + e.cost) {
      throw new Error(
        `lease ${step.lease ?? '(unnamed)'} (stamp ${r.stamp}, seq ${r.seq}, cost ${cost}) names entries of lease ${name} (seq ${e.seq}, cost ${e.cost})`,
      );
    }
  }
  leases.set(step.lease ?? `#${leases.size}`, {
    keys: [request.checks[0]!.key],
    entries: [{ stamp: r.stamp, seq: r.seq, cost }],
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
