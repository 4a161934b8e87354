/**
 * The conservation checker's rules, one per promise a kind may make (core/kinds/kind.ts `KindTraits.promise`):
 * each flags admissions above its bound, and only what it is sure of (a decision lies between a call's send and
 * its answer).
 */
import { describe, expect, it } from 'vitest';
import { promiseViolations, type Charge } from '../../helpers/conservation-cases.js';

const charge = (sentAt: number, at: number, cost = 1): Charge => ({
  policy: 'p',
  subject: 's',
  class: undefined,
  region: 'us',
  sentAt,
  at,
  cost,
});
const bound = { capacity: 2, refillPerSecond: 1, windowSeconds: 10 };

describe('the conservation rule of each promise', () => {
  it('burst: at most C + R·W over any span', () => {
    expect(
      promiseViolations('burst', bound, [charge(0, 0), charge(0, 0), charge(1000, 1000)], 'p/s'),
    ).toEqual([]);
    expect(promiseViolations('burst', bound, [charge(0, 0), charge(0, 0), charge(0, 500)], 'p/s')).toEqual([
      'p/s: 3 admitted in 0.5 s, above C + R·W = 2 + 1·0.5',
    ]);
  });

  it('rolling: at most C within any span shorter than the window', () => {
    const spread = [charge(0, 0), charge(9_000, 9_000), charge(10_000, 10_000)];
    expect(promiseViolations('rolling', bound, spread, 'p/s')).toEqual([]);
    const close = [charge(0, 0), charge(9_000, 9_000), charge(9_500, 9_500)];
    expect(promiseViolations('rolling', bound, close, 'p/s')).toEqual([
      'p/s: 3 admitted within 10 s, above 2',
    ]);
  });

  it('alignedWindow: at most C per window aligned to the epoch, whatever a rolling window holds', () => {
    // 4 within 2 s, but 2 in window 0 and 2 in window 1: a fixed window allows it, a rolling one would not.
    const edge = [charge(9_000, 9_000), charge(9_500, 9_500), charge(10_000, 10_000), charge(10_500, 10_500)];
    expect(promiseViolations('alignedWindow', bound, edge, 'p/s')).toEqual([]);
    expect(promiseViolations('rolling', bound, edge, 'p/s')).not.toEqual([]);
    const three = [charge(10_000, 10_000), charge(15_000, 15_000), charge(19_999, 19_999)];
    expect(promiseViolations('alignedWindow', bound, three, 'p/s')).toEqual([
      'p/s: 3 admitted in aligned window 1 of 10 s, above 2',
    ]);
    // A call sent in window 0 and answered in window 1 may have been decided in either: not counted.
    const straddling = [charge(9_900, 10_100), charge(15_000, 15_000), charge(19_999, 19_999)];
    expect(promiseViolations('alignedWindow', bound, straddling, 'p/s')).toEqual([]);
  });

  it('calendarDay: at most C per UTC day', () => {
    const day = 86_400_000;
    expect(
      promiseViolations('calendarDay', bound, [charge(0, 0), charge(1, 1), charge(day, day)], 'p/s'),
    ).toEqual([]);
    expect(
      promiseViolations('calendarDay', bound, [charge(0, 0), charge(1, 1), charge(2, 2)], 'p/s'),
    ).toEqual(['p/s: 3 admitted on day 0, above 2']);
  });
});
