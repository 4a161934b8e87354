/**
 * The transfer case table: every case runs against the model (core/models/transfer.ts over
 * core/models/token-bucket.ts) and against `lua/lend.lua` and `lua/credit.lua` (with `lua/token_bucket.lua` for
 * charges) on a real Redis; replies must be identical, and `expect` pins the numbers we promise.
 * Amounts are in tokens, time in virtual ms since the case began.
 */
import { encodeRequest, type BucketCheck } from '../../core/wire/bucket.js';
import {
  creditOnModel,
  lendOnModel,
  transferBucket,
  type EncodedCredit,
  type EncodedCreditResult,
  type EncodedLend,
  type EncodedLendResult,
  type LendMode,
} from '../../core/models/transfer.js';
import {
  BucketModel,
  MICRO,
  type EncodedReply,
  type EncodedRequest,
} from '../../core/models/token-bucket.js';

export interface TransferCaseBucket {
  bucket: string;
  capacity: number;
  refillPerSecond: number;
  floor?: { beforeMs: number; refillPerSecond: number; capacity: number };
}

export type TransferCaseStep =
  | {
      op: 'charge';
      at: number;
      check: TransferCaseBucket;
      cost?: number;
      repeat?: number;
      expect?: { allowed?: boolean; remaining?: number } | undefined;
    }
  | {
      op: 'lend';
      at: number;
      check: TransferCaseBucket;
      mode: LendMode;
      /** Tokens asked. */
      amount: number;
      expect?: { granted?: number; remaining?: number; refillMs?: number };
    }
  | {
      op: 'credit';
      at: number;
      check: TransferCaseBucket;
      /** Tokens granted. */
      amount: number;
      expect?: { credited?: number; dropped?: number; tokens?: number };
    };

export interface TransferCase {
  name: string;
  steps: TransferCaseStep[];
}

const us = { bucket: 'us', capacity: 20, refillPerSecond: 0.5 };
const eu = { bucket: 'eu', capacity: 20, refillPerSecond: 0.5 };

export const transferCases: TransferCase[] = [
  {
    name: 'a lender never seen is full: it grants what is asked and keeps the rest',
    steps: [
      { op: 'lend', at: 0, check: eu, mode: 'fill', amount: 12, expect: { granted: 12, remaining: 8 } },
      { op: 'charge', at: 0, check: eu, cost: 8, expect: { allowed: true, remaining: 0 } },
      { op: 'charge', at: 0, check: eu, expect: { allowed: false } },
    ],
  },
  {
    name: 'a lender grants at most its stock, never more than asked, never below zero',
    steps: [
      { op: 'charge', at: 0, check: eu, cost: 15, expect: { allowed: true, remaining: 5 } },
      { op: 'lend', at: 0, check: eu, mode: 'fill', amount: 12, expect: { granted: 5, remaining: 0 } },
      { op: 'lend', at: 0, check: eu, mode: 'fill', amount: 12, expect: { granted: 0, remaining: 0 } },
    ],
  },
  {
    name: 'a lend refills first, on the lender time',
    steps: [
      { op: 'charge', at: 0, check: eu, cost: 20, expect: { remaining: 0 } },
      {
        op: 'lend',
        at: 6000,
        check: eu,
        mode: 'fill',
        amount: 5,
        expect: { granted: 3, remaining: 0, refillMs: 10000 },
      },
    ],
  },
  {
    name: 'refillMs says when the lender could give the amount again, capped at its capacity',
    steps: [
      {
        op: 'lend',
        at: 0,
        check: { bucket: 'e', capacity: 4, refillPerSecond: 2 },
        mode: 'fill',
        amount: 10,
        expect: { granted: 4, remaining: 0, refillMs: 2000 },
      },
    ],
  },
  {
    name: 'a lender with no share has nothing and never will',
    steps: [
      {
        op: 'lend',
        at: 0,
        check: { bucket: 'z', capacity: 0, refillPerSecond: 0 },
        mode: 'fill',
        amount: 1,
        expect: { granted: 0, remaining: 0, refillMs: -1 },
      },
    ],
  },
  {
    name: 'spend charges the whole cost or nothing',
    steps: [
      { op: 'charge', at: 0, check: eu, cost: 17, expect: { remaining: 3 } },
      { op: 'lend', at: 0, check: eu, mode: 'spend', amount: 4, expect: { granted: 0, remaining: 3 } },
      { op: 'lend', at: 0, check: eu, mode: 'spend', amount: 3, expect: { granted: 3, remaining: 0 } },
    ],
  },
  {
    name: 'spare (a top-up) gives only what the lender holds above half its burst',
    steps: [
      { op: 'lend', at: 0, check: eu, mode: 'spare', amount: 15, expect: { granted: 10, remaining: 10 } },
      { op: 'lend', at: 0, check: eu, mode: 'spare', amount: 1, expect: { granted: 0, remaining: 10 } },
      { op: 'charge', at: 0, check: eu, cost: 4, expect: { allowed: true, remaining: 6 } },
      { op: 'lend', at: 0, check: eu, mode: 'spare', amount: 1, expect: { granted: 0, remaining: 6 } },
      // A refusal's fill still takes everything.
      { op: 'lend', at: 0, check: eu, mode: 'fill', amount: 20, expect: { granted: 6, remaining: 0 } },
      // Refilled to 11 tokens (0.5/s for 22 s): one above the reserve of 10.
      { op: 'lend', at: 22_000, check: eu, mode: 'spare', amount: 5, expect: { granted: 1, remaining: 10 } },
    ],
  },
  {
    name: 'spend above the lender capacity can never be granted',
    steps: [
      { op: 'lend', at: 0, check: eu, mode: 'spend', amount: 21, expect: { granted: 0, refillMs: -1 } },
    ],
  },
  {
    name: 'a credit fills the borrower up to its capacity and drops the surplus',
    steps: [
      { op: 'charge', at: 0, check: us, cost: 20, expect: { remaining: 0 } },
      { op: 'credit', at: 0, check: us, amount: 12, expect: { credited: 12, dropped: 0, tokens: 12 } },
      { op: 'credit', at: 0, check: us, amount: 12, expect: { credited: 8, dropped: 4, tokens: 20 } },
      { op: 'charge', at: 0, check: us, cost: 20, expect: { allowed: true, remaining: 0 } },
    ],
  },
  {
    name: 'a credit refills first: tokens that refilled meanwhile leave less room',
    steps: [
      { op: 'charge', at: 0, check: us, cost: 20 },
      { op: 'credit', at: 30000, check: us, amount: 15, expect: { credited: 5, dropped: 10, tokens: 20 } },
    ],
  },
  {
    name: 'a missing borrower bucket is full: everything is dropped and it stays full, not more',
    steps: [
      { op: 'credit', at: 0, check: us, amount: 5, expect: { credited: 0, dropped: 5, tokens: 20 } },
      { op: 'charge', at: 0, check: us, cost: 20, expect: { allowed: true, remaining: 0 } },
      { op: 'charge', at: 0, check: us, expect: { allowed: false } },
    ],
  },
  {
    name: 'a credit never fills past the lower of the stored and the given capacity (a shrunk share)',
    steps: [
      { op: 'charge', at: 0, check: us, cost: 20 },
      {
        op: 'credit',
        at: 0,
        check: { ...us, capacity: 6 },
        amount: 10,
        expect: { credited: 6, dropped: 4, tokens: 6 },
      },
      { op: 'charge', at: 0, check: us, cost: 7, expect: { allowed: false, remaining: 6 } },
    ],
  },
  {
    name: 'a transfer conserves: what the lender gave is what the borrower holds',
    steps: [
      { op: 'charge', at: 0, check: us, cost: 20 },
      { op: 'lend', at: 0, check: eu, mode: 'fill', amount: 20, expect: { granted: 20, remaining: 0 } },
      { op: 'credit', at: 0, check: us, amount: 20, expect: { credited: 20, tokens: 20 } },
      { op: 'charge', at: 0, check: us, cost: 20, expect: { allowed: true, remaining: 0 } },
      { op: 'charge', at: 0, check: eu, expect: { allowed: false, remaining: 0 } },
    ],
  },
  {
    name: 'fractional amounts move to the micro-token',
    steps: [
      { op: 'charge', at: 0, check: us, cost: 19.65 },
      {
        op: 'lend',
        at: 0,
        check: eu,
        mode: 'fill',
        amount: 0.333333,
        expect: { granted: 0.333333, remaining: 19.666667 },
      },
      { op: 'credit', at: 0, check: us, amount: 0.333333, expect: { credited: 0.333333, tokens: 0.683333 } },
    ],
  },
  {
    name: 'the capacity floor clamps an old lender bucket before it lends',
    steps: [
      { op: 'charge', at: 0, check: eu, expect: { remaining: 19 } },
      {
        op: 'lend',
        at: 1000,
        check: { ...eu, floor: { beforeMs: 500, refillPerSecond: 0, capacity: 4 } },
        mode: 'fill',
        amount: 10,
        expect: { granted: 4, remaining: 0 },
      },
    ],
  },
  {
    name: 'a missing lender bucket starts at the floor capacity',
    steps: [
      {
        op: 'lend',
        at: 1000,
        check: { ...eu, floor: { beforeMs: 500, refillPerSecond: 0, capacity: 4 } },
        mode: 'fill',
        amount: 10,
        expect: { granted: 4, remaining: 0 },
      },
    ],
  },
  {
    name: 'a clock step backwards refills nothing at the lender',
    steps: [
      { op: 'charge', at: 1000, check: eu, cost: 20 },
      { op: 'lend', at: 0, check: eu, mode: 'fill', amount: 1, expect: { granted: 0, remaining: 0 } },
    ],
  },
];

/** Virtual Redis time at which every case starts, in µs. */
export const TRANSFER_CASE_EPOCH_MICROS = 1_750_000_000_000_000;

export type PreparedTransferStep =
  | { kind: 'charge'; step: TransferCaseStep; request: EncodedRequest; nowMicros: number }
  | { kind: 'lend'; step: TransferCaseStep; lend: EncodedLend; nowMicros: number }
  | { kind: 'credit'; step: TransferCaseStep; credit: EncodedCredit; nowMicros: number };

export type TransferReply = EncodedReply | EncodedLendResult | EncodedCreditResult;

function bucketOf(prefix: string, b: TransferCaseBucket): Omit<BucketCheck, 'cost'> {
  return {
    key: `rl:v1:{${prefix}}:${b.bucket}`,
    capacity: b.capacity,
    refillPerSecond: b.refillPerSecond,
    ttlMs: 3_600_000,
    floor:
      b.floor === undefined
        ? undefined
        : {
            beforeMicros: TRANSFER_CASE_EPOCH_MICROS + Math.round(b.floor.beforeMs * 1000),
            refillPerSecond: b.floor.refillPerSecond,
            capacity: b.floor.capacity,
          },
  };
}

const micros = (tokens: number) => Math.round(tokens * MICRO);

/** Build the calls of a case with keys under `prefix` (one hash-tag slot). */
export function prepareTransferCase(prefix: string, c: TransferCase): PreparedTransferStep[] {
  const out: PreparedTransferStep[] = [];
  for (const step of c.steps) {
    const nowMicros = TRANSFER_CASE_EPOCH_MICROS + Math.round(step.at * 1000);
    const bucket = bucketOf(prefix, step.check);
    if (step.op === 'charge') {
      const request = encodeRequest({ checks: [{ ...bucket, cost: step.cost ?? 1 }] });
      const repeat = step.repeat ?? 1;
      for (let i = 0; i < repeat; i++) {
        const checked = i === repeat - 1 ? step : { ...step, expect: undefined };
        out.push({ kind: 'charge', step: checked, request, nowMicros });
      }
    } else if (step.op === 'lend') {
      const lend: EncodedLend = {
        key: bucket.key,
        bucket: transferBucket(bucket),
        mode: step.mode,
        amount: micros(step.amount),
      };
      out.push({ kind: 'lend', step, lend, nowMicros });
    } else {
      const credit: EncodedCredit = {
        key: bucket.key,
        bucket: transferBucket(bucket),
        amount: micros(step.amount),
      };
      out.push({ kind: 'credit', step, credit, nowMicros });
    }
  }
  return out;
}

/** Mismatches between a step's expectations and a reply (empty when it holds). */
export function checkTransferStep(step: TransferCaseStep, reply: TransferReply): string[] {
  const problems: string[] = [];
  const same = (what: string, want: unknown, got: unknown) => {
    if (want !== undefined && JSON.stringify(want) !== JSON.stringify(got))
      problems.push(`${what}: want ${JSON.stringify(want)} got ${JSON.stringify(got)}`);
  };
  const tokens = (m: number) => m / MICRO;
  if (step.op === 'charge' && 'results' in reply) {
    same('allowed', step.expect?.allowed, reply.allowed);
    same('remaining', step.expect?.remaining, tokens(reply.results[0]!.remaining));
  } else if (step.op === 'lend' && 'granted' in reply) {
    same('granted', step.expect?.granted, tokens(reply.granted));
    same('remaining', step.expect?.remaining, tokens(reply.remaining));
    same('refillMs', step.expect?.refillMs, reply.refillMs);
  } else if (step.op === 'credit' && 'credited' in reply) {
    same('credited', step.expect?.credited, tokens(reply.credited));
    same('dropped', step.expect?.dropped, tokens(reply.dropped));
    same('tokens', step.expect?.tokens, tokens(reply.tokens));
  } else {
    problems.push(`reply of the wrong kind for ${step.op}`);
  }
  return problems;
}

/** Run a case on the model alone; returns every reply and every broken expectation. */
export function runTransferCaseOnModel(
  prefix: string,
  c: TransferCase,
): { replies: TransferReply[]; problems: string[] } {
  const model = new BucketModel();
  const replies: TransferReply[] = [];
  const problems: string[] = [];
  prepareTransferCase(prefix, c).forEach((p, i) => {
    const reply =
      p.kind === 'charge'
        ? model.evaluate(p.request, p.nowMicros)
        : p.kind === 'lend'
          ? lendOnModel(model, p.lend, p.nowMicros)
          : creditOnModel(model, p.credit, p.nowMicros);
    replies.push(reply);
    for (const problem of checkTransferStep(p.step, reply)) problems.push(`step ${i}: ${problem}`);
  });
  return { replies, problems };
}
