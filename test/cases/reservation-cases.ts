/**
 * The reservation case table: creates and settles run against the model (core/models/reservation.ts) and against
 * `lua/reservation_create.lua` + `lua/reservation_settle.lua` on a real Redis, replies compared exactly.
 * Steps carry virtual time (`at`, ms since the case began); amounts are micro-units. A create marked `refused`
 * must fail with QP_EXISTS and write nothing.
 */
import type { SettleAction, SettleOutcome } from '../../core/models/reservation.js';

export type ReservationStep =
  | { at: number; op: 'create'; amount: number; ttlMs: number; refused?: true }
  | {
      at: number;
      op: SettleAction;
      amount?: number;
      expect: Partial<SettleOutcome> & { kind: SettleOutcome['kind'] };
    };

export interface ReservationCase {
  name: string;
  steps: ReservationStep[];
}

const M = 1_000_000;
const reserve = { at: 0, op: 'create' as const, amount: 10 * M, ttlMs: 60_000 };

export const reservationCases: ReservationCase[] = [
  {
    name: 'commit keeps what was used and says what to refund; the same commit again is a replay',
    steps: [
      reserve,
      {
        at: 10,
        op: 'commit',
        amount: 3 * M,
        expect: { kind: 'settled', state: 'committed', reservedMicros: 10 * M, committedMicros: 3 * M },
      },
      {
        at: 20,
        op: 'commit',
        amount: 3 * M,
        expect: { kind: 'replay', state: 'committed', committedMicros: 3 * M },
      },
      { at: 30, op: 'commit', amount: 4 * M, expect: { kind: 'conflict', state: 'committed' } },
      { at: 40, op: 'cancel', expect: { kind: 'conflict', state: 'committed' } },
      { at: 120_000, op: 'expire', expect: { kind: 'conflict', state: 'committed' } },
    ],
  },
  {
    name: 'a commit above the reservation changes nothing; a commit of all of it or of nothing is fine',
    steps: [
      reserve,
      { at: 10, op: 'commit', amount: 10 * M + 1, expect: { kind: 'above', reservedMicros: 10 * M } },
      {
        at: 20,
        op: 'commit',
        amount: 0,
        expect: { kind: 'settled', state: 'committed', committedMicros: 0 },
      },
    ],
  },
  {
    name: 'cancel refunds all; a repeat is a replay; a commit after it conflicts',
    steps: [
      reserve,
      { at: 10, op: 'cancel', expect: { kind: 'settled', state: 'cancelled', committedMicros: 0 } },
      { at: 20, op: 'cancel', expect: { kind: 'replay', state: 'cancelled' } },
      { at: 30, op: 'commit', amount: M, expect: { kind: 'conflict', state: 'cancelled' } },
    ],
  },
  {
    name: 'the sweep expires a reservation at its expiry, not a microsecond before, and only once',
    steps: [
      reserve,
      { at: 59_999.999, op: 'expire', expect: { kind: 'not_due' } },
      {
        at: 60_000,
        op: 'expire',
        expect: { kind: 'settled', state: 'expired', reservedMicros: 10 * M, committedMicros: 0 },
      },
      { at: 60_001, op: 'expire', expect: { kind: 'conflict', state: 'expired' } },
      { at: 60_002, op: 'commit', amount: M, expect: { kind: 'conflict', state: 'expired' } },
    ],
  },
  {
    name: 'a commit at the expiry expires it (refunded whole) and says so',
    steps: [
      reserve,
      { at: 60_000, op: 'commit', amount: M, expect: { kind: 'expired', reservedMicros: 10 * M } },
      { at: 60_001, op: 'expire', expect: { kind: 'conflict', state: 'expired' } },
    ],
  },
  {
    name: 'an abort settles a reserved record as aborted (refund it whole); a repeat replays, the rest conflicts',
    steps: [
      reserve,
      {
        at: 10,
        op: 'abort',
        amount: 10 * M,
        expect: { kind: 'settled', state: 'aborted', reservedMicros: 10 * M, committedMicros: 0 },
      },
      {
        at: 20,
        op: 'abort',
        amount: 10 * M,
        expect: { kind: 'replay', state: 'aborted', reservedMicros: 10 * M, committedMicros: 0 },
      },
      { at: 30, op: 'commit', amount: M, expect: { kind: 'conflict', state: 'aborted' } },
      { at: 40, op: 'cancel', expect: { kind: 'conflict', state: 'aborted' } },
      { at: 120_000, op: 'expire', expect: { kind: 'conflict', state: 'aborted' } },
      { ...reserve, at: 120_001, refused: true },
    ],
  },
  {
    name: 'an abort of no record leaves a tombstone: a late create is refused, the sweep and settles conflict',
    steps: [
      { at: 0, op: 'abort', amount: 10 * M, expect: { kind: 'tombstoned' } },
      { ...reserve, at: 5, refused: true },
      {
        at: 10,
        op: 'abort',
        amount: 10 * M,
        expect: { kind: 'replay', state: 'aborted', reservedMicros: 10 * M, committedMicros: 0 },
      },
      { at: 20, op: 'commit', amount: M, expect: { kind: 'conflict', state: 'aborted' } },
      { at: 30, op: 'cancel', expect: { kind: 'conflict', state: 'aborted' } },
      { at: 120_000, op: 'expire', expect: { kind: 'conflict', state: 'aborted', reservedMicros: 10 * M } },
    ],
  },
  {
    name: 'an abort after the sweep expired the record refunds nothing',
    steps: [
      reserve,
      { at: 60_000, op: 'expire', expect: { kind: 'settled', state: 'expired' } },
      { at: 60_001, op: 'abort', amount: 10 * M, expect: { kind: 'conflict', state: 'expired' } },
    ],
  },
  {
    name: 'an abort past the expiry, before the sweep, aborts it whole; the sweep then conflicts',
    steps: [
      reserve,
      {
        at: 70_000,
        op: 'abort',
        amount: 10 * M,
        expect: { kind: 'settled', state: 'aborted', reservedMicros: 10 * M },
      },
      { at: 70_001, op: 'expire', expect: { kind: 'conflict', state: 'aborted' } },
    ],
  },
  {
    name: 'a second create of the same id is refused and changes nothing',
    steps: [
      reserve,
      { ...reserve, at: 10, amount: 3 * M, refused: true },
      { at: 20, op: 'cancel', expect: { kind: 'settled', state: 'cancelled', reservedMicros: 10 * M } },
    ],
  },
  {
    name: 'no record: missing for every action',
    steps: [
      { at: 0, op: 'commit', amount: M, expect: { kind: 'missing' } },
      { at: 0, op: 'cancel', expect: { kind: 'missing' } },
      { at: 0, op: 'expire', expect: { kind: 'missing' } },
    ],
  },
];

/** Mismatches between a step's expectation and an outcome (only the fields the step names). */
export function checkSettle(expect: Record<string, unknown>, got: SettleOutcome): string[] {
  const problems: string[] = [];
  for (const [k, v] of Object.entries(expect)) {
    const g = (got as unknown as Record<string, unknown>)[k];
    if (g !== v) problems.push(`${k}: want ${JSON.stringify(v)} got ${JSON.stringify(g)}`);
  }
  return problems;
}
