/**
 * The refund case table: every case runs against the model (core/models/refund.ts over core/models/token-bucket.ts) and
 * against `lua/refund.lua` (with `lua/token_bucket.lua` for the charges) on a real Redis; replies must be
 * identical, and `expect` pins the numbers we promise. Amounts are in tokens, time in virtual ms.
 */
import { encodeRequest } from '../../core/wire/bucket.js';
import { idempotencyRecordKey } from '../../core/keys.js';
import {
  RefundableBucketModel,
  encodeRefund,
  type EncodedRefund,
  type EncodedRefundReply,
} from '../../core/models/refund.js';
import { MICRO, type EncodedReply, type EncodedRequest } from '../../core/models/token-bucket.js';

export interface RefundCaseBucket {
  bucket: string;
  capacity: number;
  refillPerSecond: number;
  cost?: number;
}

export type RefundCaseStep =
  | {
      op: 'charge';
      at: number;
      checks: RefundCaseBucket[];
      repeat?: number;
      expect?: { allowed?: boolean; remaining?: number[] } | undefined;
    }
  | {
      op: 'refund';
      checks: { bucket: string; cost: number; capacity: number }[];
      /** Give the request's idempotency record key (created by an earlier charge with `idempotencyKey`). */
      idempotencyKey?: string;
      /** When it runs (virtual ms; default: the last charge's instant), and its deadline (virtual ms), if any. */
      at?: number;
      deadline?: number;
      expect?: { refunded?: number[]; tokens?: (number | null)[]; recordDeleted?: boolean; late?: boolean };
    };

/** A charge step may carry an idempotency key so a later refund can delete its record. */
export interface RefundCase {
  name: string;
  steps: (RefundCaseStep & { idempotencyKey?: string })[];
}

const a10 = { bucket: 'a', capacity: 10, refillPerSecond: 1 };

export const refundCases: RefundCase[] = [
  {
    name: 'gives back exactly what was charged',
    steps: [
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 4 }], expect: { allowed: true, remaining: [6] } },
      {
        op: 'refund',
        checks: [{ bucket: 'a', cost: 4, capacity: 10 }],
        expect: { refunded: [4], tokens: [10] },
      },
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 10 }], expect: { allowed: true, remaining: [0] } },
    ],
  },
  {
    name: 'never fills past the capacity: a bucket that refilled meanwhile gets only the room left',
    steps: [
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 3 }], expect: { remaining: [7] } },
      { op: 'charge', at: 2000, checks: [{ ...a10, cost: 1 }], expect: { remaining: [8] } },
      {
        op: 'refund',
        checks: [{ bucket: 'a', cost: 3, capacity: 10 }],
        expect: { refunded: [2], tokens: [10] },
      },
      { op: 'charge', at: 2000, checks: [a10], expect: { allowed: true, remaining: [9] } },
    ],
  },
  {
    name: 'a refund with a deadline runs by it: it gives back as any refund',
    steps: [
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 4 }], expect: { allowed: true, remaining: [6] } },
      {
        op: 'refund',
        at: 1000,
        deadline: 1000,
        checks: [{ bucket: 'a', cost: 4, capacity: 10 }],
        expect: { refunded: [4], tokens: [10], late: false },
      },
      { op: 'charge', at: 1000, checks: [{ ...a10, cost: 10 }], expect: { allowed: true, remaining: [0] } },
    ],
  },
  {
    name: 'a refund that runs past its deadline changes nothing and says so',
    steps: [
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 4 }], expect: { allowed: true, remaining: [6] } },
      {
        op: 'refund',
        at: 1000,
        deadline: 999,
        checks: [{ bucket: 'a', cost: 4, capacity: 10 }],
        expect: { refunded: [], late: true },
      },
      // 6 left at 0, refilled by 1 in the second since: the refund gave nothing.
      { op: 'charge', at: 1000, checks: [a10], expect: { allowed: true, remaining: [6] } },
    ],
  },
  {
    name: 'a missing bucket is full: nothing is given back and it stays missing',
    steps: [
      {
        op: 'refund',
        checks: [{ bucket: 'never', cost: 5, capacity: 10 }],
        expect: { refunded: [0], tokens: [null] },
      },
      {
        op: 'charge',
        at: 0,
        checks: [{ bucket: 'never', capacity: 10, refillPerSecond: 1, cost: 10 }],
        expect: { allowed: true, remaining: [0] },
      },
    ],
  },
  {
    name: 'clamps at the lower of the stored and the given capacity (a share that shrank)',
    steps: [
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 6 }], expect: { remaining: [4] } },
      {
        op: 'refund',
        checks: [{ bucket: 'a', cost: 6, capacity: 7 }],
        expect: { refunded: [3], tokens: [7] },
      },
    ],
  },
  {
    name: 'never takes tokens away when the given capacity is below what the bucket holds',
    steps: [
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 1 }], expect: { remaining: [9] } },
      {
        op: 'refund',
        checks: [{ bucket: 'a', cost: 1, capacity: 5 }],
        expect: { refunded: [0], tokens: [9] },
      },
    ],
  },
  {
    name: 'fractional costs come back to the micro-token',
    steps: [
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 0.35 }], expect: { remaining: [9.65] } },
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 2.5 }], expect: { remaining: [7.15] } },
      {
        op: 'refund',
        checks: [{ bucket: 'a', cost: 2.5, capacity: 10 }],
        expect: { refunded: [2.5], tokens: [9.65] },
      },
    ],
  },
  {
    name: 'several buckets at once, each on its own terms; then refill continues from the refunded level',
    steps: [
      {
        op: 'charge',
        at: 0,
        checks: [
          { ...a10, cost: 5 },
          { bucket: 'b', capacity: 4, refillPerSecond: 2, cost: 4 },
        ],
        expect: { allowed: true, remaining: [5, 0] },
      },
      {
        op: 'refund',
        checks: [
          { bucket: 'a', cost: 5, capacity: 10 },
          { bucket: 'b', cost: 4, capacity: 4 },
          { bucket: 'c', cost: 1, capacity: 4 },
        ],
        expect: { refunded: [5, 4, 0], tokens: [10, 4, null] },
      },
      {
        op: 'charge',
        at: 500,
        checks: [{ bucket: 'b', capacity: 4, refillPerSecond: 2, cost: 4 }],
        expect: { allowed: true, remaining: [0] },
      },
    ],
  },
  {
    name: 'deletes the idempotency record so a retry decides afresh',
    steps: [
      {
        op: 'charge',
        at: 0,
        checks: [{ ...a10, cost: 2 }],
        idempotencyKey: 'k1',
        expect: { allowed: true, remaining: [8] },
      },
      {
        op: 'refund',
        checks: [{ bucket: 'a', cost: 2, capacity: 10 }],
        idempotencyKey: 'k1',
        expect: { refunded: [2], tokens: [10], recordDeleted: true },
      },
      {
        op: 'refund',
        checks: [{ bucket: 'a', cost: 2, capacity: 10 }],
        idempotencyKey: 'k1',
        expect: { refunded: [0], tokens: [10], recordDeleted: false },
      },
      {
        op: 'charge',
        at: 0,
        checks: [{ ...a10, cost: 2 }],
        idempotencyKey: 'k1',
        expect: { allowed: true, remaining: [8] },
      },
    ],
  },
  {
    name: 'remembers admissions only: a refused charge retried with its key after the refill is decided afresh',
    steps: [
      { op: 'charge', at: 0, checks: [{ ...a10, cost: 10 }], expect: { allowed: true, remaining: [0] } },
      {
        op: 'charge',
        at: 0,
        checks: [{ ...a10, cost: 3 }],
        idempotencyKey: 'k2',
        expect: { allowed: false, remaining: [0] },
      },
      {
        op: 'charge',
        at: 3000,
        checks: [{ ...a10, cost: 3 }],
        idempotencyKey: 'k2',
        expect: { allowed: true, remaining: [0] },
      },
      {
        op: 'charge',
        at: 3000,
        checks: [{ ...a10, cost: 3 }],
        idempotencyKey: 'k2',
        expect: { allowed: true, remaining: [0] },
      },
      { op: 'charge', at: 3000, checks: [{ ...a10, cost: 1 }], expect: { allowed: false, remaining: [0] } },
    ],
  },
];

/** Virtual Redis time at which every case starts, in µs. */
export const REFUND_CASE_EPOCH_MICROS = 1_750_000_000_000_000;

/** One step as both sides see it: a token-bucket call or a refund call, in script units. */
export type PreparedRefundStep =
  | { kind: 'charge'; step: RefundCaseStep; request: EncodedRequest; nowMicros: number }
  | { kind: 'refund'; step: RefundCaseStep; refund: EncodedRefund; nowMicros: number };

/** Build the calls of a case with keys under `prefix` (one hash-tag slot). */
export function prepareRefundCase(prefix: string, c: RefundCase): PreparedRefundStep[] {
  const key = (bucket: string) => `rl:v1:{${prefix}}:${bucket}`;
  const record = (k: string) => idempotencyRecordKey(prefix, k);
  const out: PreparedRefundStep[] = [];
  let now = REFUND_CASE_EPOCH_MICROS;
  for (const step of c.steps) {
    if (step.op === 'charge') {
      now = REFUND_CASE_EPOCH_MICROS + Math.round(step.at * 1000);
      const request = encodeRequest({
        checks: step.checks.map((b) => ({
          key: key(b.bucket),
          capacity: b.capacity,
          refillPerSecond: b.refillPerSecond,
          cost: b.cost ?? 1,
          ttlMs: 3_600_000,
        })),
        idempotency:
          step.idempotencyKey === undefined
            ? undefined
            : { key: record(step.idempotencyKey), ttlMs: 3_600_000 },
      });
      const repeat = step.repeat ?? 1;
      for (let i = 0; i < repeat; i++) {
        out.push({
          kind: 'charge',
          step: i === repeat - 1 ? step : { ...step, expect: undefined },
          request,
          nowMicros: now,
        });
      }
    } else {
      if (step.at !== undefined) now = REFUND_CASE_EPOCH_MICROS + Math.round(step.at * 1000);
      const refund = encodeRefund({
        checks: step.checks.map((b) => ({ key: key(b.bucket), cost: b.cost, capacity: b.capacity })),
        idempotencyRecordKey: step.idempotencyKey === undefined ? undefined : record(step.idempotencyKey),
        ...(step.deadline === undefined
          ? {}
          : { deadlineMicros: REFUND_CASE_EPOCH_MICROS + Math.round(step.deadline * 1000) }),
      });
      out.push({ kind: 'refund', step, refund, nowMicros: now });
    }
  }
  return out;
}

/** Mismatches between a step's expectations and a reply (empty when it holds). */
export function checkRefundStep(step: RefundCaseStep, reply: EncodedReply | EncodedRefundReply): string[] {
  const problems: string[] = [];
  const same = (what: string, want: unknown, got: unknown) => {
    if (JSON.stringify(want) !== JSON.stringify(got))
      problems.push(`${what}: want ${JSON.stringify(want)} got ${JSON.stringify(got)}`);
  };
  if (step.op === 'charge' && 'allowed' in reply) {
    if (step.expect?.allowed !== undefined) same('allowed', step.expect.allowed, reply.allowed);
    if (step.expect?.remaining !== undefined)
      same(
        'remaining',
        step.expect.remaining,
        reply.results.map((r) => r.remaining / MICRO),
      );
  }
  if (step.op === 'refund' && 'recordDeleted' in reply) {
    if (step.expect?.refunded !== undefined)
      same(
        'refunded',
        step.expect.refunded,
        reply.results.map((r) => r.refunded / MICRO),
      );
    if (step.expect?.tokens !== undefined)
      same(
        'tokens',
        step.expect.tokens,
        reply.results.map((r) => (r.tokens < 0 ? null : r.tokens / MICRO)),
      );
    if (step.expect?.recordDeleted !== undefined)
      same('recordDeleted', step.expect.recordDeleted, reply.recordDeleted);
    if (step.expect?.late !== undefined) same('late', step.expect.late, reply.late === true);
  }
  return problems;
}

/** Run a case on the model alone; returns every reply and every broken expectation. */
export function runRefundCaseOnModel(
  prefix: string,
  c: RefundCase,
): { replies: (EncodedReply | EncodedRefundReply)[]; problems: string[] } {
  const model = new RefundableBucketModel();
  const replies: (EncodedReply | EncodedRefundReply)[] = [];
  const problems: string[] = [];
  prepareRefundCase(prefix, c).forEach((p, i) => {
    const reply =
      p.kind === 'charge' ? model.evaluate(p.request, p.nowMicros) : model.refund(p.refund, p.nowMicros);
    replies.push(reply);
    for (const problem of checkRefundStep(p.step, reply)) problems.push(`step ${i}: ${problem}`);
  });
  return { replies, problems };
}
