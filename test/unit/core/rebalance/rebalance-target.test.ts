import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DemandTracker } from '../../../../core/rebalance/demand.js';
import { defaultRebalanceSettings as settings } from '../../../../core/rebalance/settings.js';
import {
  idealShares,
  nextShares,
  rebalanceRound,
  roomNeeded,
  shareFloor,
  targetShares,
} from '../../../../core/rebalance/target.js';

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

  it('sums to 1, never breaks a floor, shrinks no region by more than maxStep, and ignores changes inside the hysteresis band', () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: 0, max: 1000, noNaN: true }), { minLength: 2, maxLength: 6 }),
        // Whole weights: a subnormal double such as 5e-324 divided by itself makes a `current` above 1 (an
        // input the rebalancer never receives, whose correction may move a region by more than maxStep).
        fc.array(fc.integer({ min: 0, max: 1_000_000 }), { minLength: 6, maxLength: 6 }),
        fc.double({ min: 0, max: 0.15, noNaN: true }),
        (demand, raw, floor) => {
          const n = demand.length;
          const total = raw.slice(0, n).reduce((a, b) => a + b, 0) || 1;
          const current = raw.slice(0, n).map((r) => floor + ((1 - floor * n) * r) / total);
          expect(current.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(1 + 1e-12);
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
          // The step hands out the whole budget (the growers take what the shrinks free), never more.
          expect(next.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 9);
          expect(next.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(1 + 1e-12);
          for (const s of next) expect(s).toBeGreaterThanOrEqual(floor - 1e-12);
          // No region shrinks by more than maxStep in one step (shrinks are not deepened to pay for grows), and a
          // region that grows by more takes only what the shrinks freed: it does not pass its ideal.
          const ideal = idealShares(demand, floor)!;
          next.forEach((s, i) => {
            expect(current[i]! - s).toBeLessThanOrEqual(settings.maxStep + 1e-12);
            if (s - current[i]! > settings.maxStep + 1e-12) expect(s).toBeLessThanOrEqual(ideal[i]! + 1e-12);
          });
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

describe('what a round knows of demand', () => {
  const known = [true, true, true];
  it('a region not heard from is unknown, not zero: it keeps its share and the others share the rest', () => {
    const current = [0.325, 0.35, 0.325];
    const d = { demand: [60, 60, 0], unmet: [10, 10, 0], known: [true, true, false] };
    const ideal = targetShares(current, d, 0.02)!;
    expect(ideal[2]).toBe(0.325);
    expect(ideal[0]).toBeCloseTo(0.3375, 12);
    expect(ideal[1]).toBeCloseTo(0.3375, 12);
    // Known zero is zero: the region goes to its floor.
    expect(targetShares(current, { ...d, known }, 0.02)![2]).toBeCloseTo(0.02, 12);
  });

  it('room is needed only where a region the target grows has demand refused', () => {
    const current = [1 / 3, 1 / 3, 1 / 3];
    const ideal = [0.6, 0.2, 0.2];
    const served = { demand: [60, 20, 20], unmet: [0, 0, 0], known };
    expect(roomNeeded(current, ideal, served, settings)).toBe(false);
    const short = { ...served, unmet: [6, 0, 0] };
    expect(roomNeeded(current, ideal, short, settings)).toBe(true);
    // Refusals only in regions that would shrink do not count.
    expect(roomNeeded(current, ideal, { ...served, unmet: [0, 5, 5] }, settings)).toBe(false);
    expect(roomNeeded(current, ideal, served, { ...settings, unmetFraction: 0 })).toBe(true);
  });

  it('a move at rest waits until the target stayed beyond the band for confirmMs, with room needed', () => {
    // One step of 85% of the gap (maxStep 1), so the step below is the damped one.
    const s = { ...settings, confirmMs: 2000, maxStep: 1 };
    const state = { shares: [1 / 3, 1 / 3, 1 / 3], moving: false };
    const ideal = [0.6, 0.2, 0.2];
    const demand = { demand: [60, 20, 20], unmet: [6, 0, 0], known };
    expect(rebalanceRound(state, ideal, 0.02, s, { now: 0, demand })).toBeUndefined();
    expect(rebalanceRound(state, ideal, 0.02, s, { now: 1000, demand })).toBeUndefined();
    // One round back inside the band (or without refusals) starts the wait again.
    expect(
      rebalanceRound(state, ideal, 0.02, s, { now: 1500, demand: { ...demand, unmet: [0, 0, 0] } }),
    ).toBeUndefined();
    expect(rebalanceRound(state, ideal, 0.02, s, { now: 2000, demand })).toBeUndefined();
    expect(rebalanceRound(state, ideal, 0.02, s, { now: 3000, demand })).toBeUndefined();
    const next = rebalanceRound(state, ideal, 0.02, s, { now: 4000, demand })!;
    expect(next[0]).toBeCloseTo(1 / 3 + 0.85 * (0.6 - 1 / 3), 12);
    expect(state.moving).toBe(true);
    // Once moving, no gate: it finishes the move.
    state.shares = next;
    expect(
      rebalanceRound(state, ideal, 0.02, s, { now: 5000, demand: { ...demand, unmet: [0, 0, 0] } }),
    ).toBeDefined();
  });
});
