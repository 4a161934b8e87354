import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DemandTracker } from '../../core/rebalance/demand.js';
import { defaultRebalanceSettings as settings } from '../../core/rebalance/settings.js';
import { idealShares, nextShares, shareFloor } from '../../core/rebalance/target.js';

describe('target shares', () => {
  it('gives every region its floor and the rest in proportion to demand', () => {
    const ideal = idealShares([8, 1, 1], 0.05)!;
    [0.73, 0.135, 0.135].forEach((want, i) => expect(ideal[i]).toBeCloseTo(want, 12));
    expect(idealShares([0, 0, 0], 0.05)).toBeUndefined();
    expect(idealShares([1, 1, 1], 0.4)).toBeUndefined();
  });

  it('floors cover the largest cost', () => {
    expect(shareFloor(100, 10, undefined, settings)).toBe(0.1);
    expect(shareFloor(100, 1, undefined, settings)).toBe(0.02);
    expect(shareFloor(100, 1, 0.2, settings)).toBe(0.2);
  });

  it('never sums above 1, never breaks a floor, and ignores changes inside the hysteresis band', () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: 0, max: 1000, noNaN: true }), { minLength: 2, maxLength: 6 }),
        fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { minLength: 6, maxLength: 6 }),
        fc.double({ min: 0, max: 0.15, noNaN: true }),
        (demand, raw, floor) => {
          const n = demand.length;
          const total = raw.slice(0, n).reduce((a, b) => a + b, 0) || 1;
          const current = raw.slice(0, n).map((r) => floor + ((1 - floor * n) * r) / total);
          const next = nextShares(current, demand, floor, settings);
          if (next === undefined) {
            const ideal = idealShares(demand, floor);
            if (ideal !== undefined) {
              expect(Math.max(...ideal.map((s, i) => Math.abs(s - current[i]!)))).toBeLessThan(
                settings.hysteresis,
              );
            }
            return;
          }
          expect(next.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(1 + 1e-12);
          for (const s of next) expect(s).toBeGreaterThanOrEqual(floor - 1e-12);
        },
      ),
      { numRuns: 2000 },
    );
  });
});

describe('demand tracker', () => {
  it('converges to a steady rate and halves its memory every half-life', () => {
    const t = new DemandTracker<string>(1000);
    for (let i = 1; i <= 20; i++) t.observe('a', 100, 1000, i * 1000);
    expect(t.rate('a', 20_000)).toBeCloseTo(100, 6);
    t.observe('a', 0, 1000, 21_000);
    expect(t.rate('a', 21_000)).toBeCloseTo(50, 6);
  });

  it('decays a key that stopped reporting', () => {
    const t = new DemandTracker<string>(1000);
    t.observe('a', 100, 1000, 0);
    expect(t.rate('a', 2000)).toBe(100);
    expect(t.rate('a', 3000)).toBeCloseTo(50, 6);
  });
});
