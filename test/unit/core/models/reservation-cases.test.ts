import { describe, expect, it } from 'vitest';
import {
  createArguments,
  parseSettleReply,
  ReservationModel,
  settleArguments,
  settlementRefunds,
} from '../../../../core/models/reservation.js';
import { checkSettle, reservationCases } from '../../../cases/reservation-cases.js';
import { LOG_CASE_EPOCH_MICROS } from '../../../cases/sliding-log-cases.js';

const body = { region: 'us', charges: [] };

describe('reservation model: the case table', () => {
  for (const c of reservationCases) {
    it(c.name, () => {
      const model = new ReservationModel();
      const problems: string[] = [];
      c.steps.forEach((s, i) => {
        const now = LOG_CASE_EPOCH_MICROS + Math.round(s.at * 1000);
        if (s.op === 'create') {
          const create = () => model.create('k', createArguments(body, s.amount, s.ttlMs), now);
          if (s.refused === true) expect(create, `step ${i}`).toThrow(/QP_EXISTS/);
          else create();
          return;
        }
        const got = model.settle('k', settleArguments(s.op, s.amount ?? 0), now);
        for (const p of checkSettle(s.expect, got)) problems.push(`step ${i} (${s.op} at ${s.at}): ${p}`);
      });
      expect(problems).toEqual([]);
    });
  }
});

describe('settlement refunds', () => {
  const charges = {
    region: 'us',
    charges: [
      { kind: 'bucket' as const, policy: 'p', key: 'rl:v1:{t}:p', capacity: 100, cost: 10 },
      { kind: 'log' as const, policy: 'l', key: 'rl:log:v1:{t}:l', stamp: 5, seq: 2, cost: 10 },
    ],
  };

  it('give back reserved - committed: tokens exactly, a log its newest whole entries', () => {
    expect(settlementRefunds(charges, 10_000_000, 2_500_000)).toEqual([
      { kind: 'bucket', request: { checks: [{ key: 'rl:v1:{t}:p', cost: 7.5, capacity: 100 }] } },
      { kind: 'log', refund: { keys: ['rl:log:v1:{t}:l'], entries: [{ stamp: 5, seq: 5, cost: 7 }] } },
    ]);
    expect(settlementRefunds(charges, 10_000_000, 10_000_000)).toEqual([]);
    expect(settlementRefunds(charges, 10_000_000, 0)[1]).toEqual({
      kind: 'log',
      refund: { keys: ['rl:log:v1:{t}:l'], entries: [{ stamp: 5, seq: 2, cost: 10 }] },
    });
  });

  it('a daily counter gets back the unused micro-units exactly, to the day it was charged', () => {
    const day = {
      region: 'us',
      charges: [{ kind: 'day' as const, policy: 'd', key: 'rl:day:v1:{t}:d', start: 7, cost: 10 }],
    };
    expect(settlementRefunds(day, 10_000_000, 2_500_001)).toEqual([
      { kind: 'day', refund: { keys: ['rl:day:v1:{t}:d'], entries: [{ start: 7, cost: 7_499_999 }] } },
    ]);
  });

  it('an abort answers tombstoned, settled or replayed as aborted', () => {
    expect(parseSettleReply(['tombstoned'])).toEqual({ kind: 'tombstoned' });
    expect(parseSettleReply(['settled', 'aborted', '5', '0', '{}'])).toEqual({
      kind: 'settled',
      state: 'aborted',
      reservedMicros: 5,
      committedMicros: 0,
      body: '{}',
    });
    expect(parseSettleReply(['replay', 'aborted', '5', '0'])).toMatchObject({
      kind: 'replay',
      state: 'aborted',
    });
    expect(parseSettleReply(['conflict', 'aborted', '5', '0'])).toMatchObject({ kind: 'conflict' });
    expect(settleArguments('abort', 5)).toEqual(['abort', '5', String(24 * 3600 * 1000)]);
  });

  it('replies of another shape are errors', () => {
    for (const bad of [
      null,
      [],
      ['settled'],
      ['replay', 'expired', '1', '0'],
      ['conflict', 'gone', '1', '0'],
      ['nope'],
      [1, 2],
    ]) {
      expect(() => parseSettleReply(bad), JSON.stringify(bad)).toThrow(TypeError);
    }
  });
});
