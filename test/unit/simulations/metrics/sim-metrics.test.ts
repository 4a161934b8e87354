import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { sharesSettledSeconds } from '../../../../simulations/metrics/share-settling.js';
import { convergenceSeconds } from '../../../../simulations/metrics/convergence.js';
import {
  AdmissionLog,
  fullestWindow,
  overAdmission,
} from '../../../../simulations/metrics/over-admission.js';
import { percentile } from '../../../../simulations/metrics/percentiles.js';

function bruteForce(times: number[], costs: number[], windowUs: number): number {
  let best = 0;
  for (const start of times) {
    let sum = 0;
    for (let i = 0; i < times.length; i++)
      if (times[i]! >= start && times[i]! <= start + windowUs) sum += costs[i]!;
    best = Math.max(best, sum);
  }
  return best;
}

describe('overAdmission', () => {
  it('finds the fullest closed window exactly (two pointers agree with brute force)', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({ t: fc.integer({ min: 0, max: 5_000_000 }), c: fc.integer({ min: 1, max: 5 }) }),
          {
            maxLength: 80,
          },
        ),
        fc.constantFrom(1, 999_999, 1_000_000, 2_500_000),
        (items, windowUs) => {
          const sorted = [...items].sort((a, b) => a.t - b.t);
          const times = sorted.map((x) => x.t);
          const costs = sorted.map((x) => x.c);
          expect(fullestWindow(times, costs, windowUs).sum).toBe(bruteForce(times, costs, windowUs));
        },
      ),
      { numRuns: 400 },
    );
  });

  it('counts both ends of a window: C + R·W admitted at its edges is exactly 1', () => {
    // C = 10, R = 1/s: 10 at t = 0 and one more at t = 1 s fill the 1 s window exactly.
    const log = new AdmissionLog();
    for (let i = 0; i < 10; i++) log.add(7, 0, 1_000_000);
    log.add(7, 1_000_000, 1_000_000);
    const o = overAdmission(log, 10, 1);
    expect(o.byWindow['1s']).toBe(1);
    expect(o.ratio).toBe(1);
    // One more a microsecond inside the window is over the budget; in the next window, not.
    log.add(7, 999_999, 1_000_000);
    log.add(8, 0, 1_000_000);
    const over = overAdmission(log, 10, 1);
    expect(over.byWindow['1s']).toBe(12 / 11);
    expect(over.worst).toEqual({ subject: 7, windowS: 1, startUs: 0, admittedMicro: 12_000_000 });
    expect(over.byWindow['10s']).toBe(12 / 20);
    expect(over.byWindow['60s']).toBe(12 / 70);
  });

  it('takes the worst subject, and sorts admissions logged out of order', () => {
    const log = new AdmissionLog();
    for (let i = 0; i < 30; i++) log.add(1, (30 - i) * 1000, 1_000_000);
    for (let i = 0; i < 5; i++) log.add(2, i, 1_000_000);
    const o = overAdmission(log, 10, 0.5);
    expect(o.ratio).toBe(30 / 10.5);
    expect(o.worst?.subject).toBe(1);
    expect(o.worst?.startUs).toBe(1000);
    expect(overAdmission(new AdmissionLog(), 10, 1).ratio).toBe(0);
  });
});

describe('percentiles', () => {
  it('uses the nearest rank', () => {
    const s = Float64Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentile(s, 50)).toBe(50);
    expect(percentile(s, 99)).toBe(99);
    expect(percentile(s, 100)).toBe(100);
    expect(percentile(Float64Array.of(3), 50)).toBe(3);
    expect(percentile(new Float64Array(0), 50)).toBe(0);
  });
});

describe('convergenceSeconds', () => {
  const options = { binS: 1, windowBins: 5, tolerance: 0.1, slack: 1, fullBins: 60, holdBins: 10 };
  const ideal = new Array<number>(60).fill(20);

  it('is 0 when a strategy tracks ideal from the shift on', () => {
    expect(convergenceSeconds(ideal, ideal, [30], options)).toBe(0);
    expect(convergenceSeconds(ideal, ideal, [], options)).toBe(0);
  });

  it('is the start of the first window after which every window stays within tolerance', () => {
    const lagging = ideal.map((v, i) => (i >= 30 && i < 42 ? 5 : v));
    // Windows starting at 38..41 still hold a lagging bin; the one starting at 42 is the first clean one.
    expect(convergenceSeconds(lagging, ideal, [30], options)).toBe(12);
    // Within tolerance (10% of 100 per window, plus slack) counts as converged.
    const close = ideal.map((v) => v * 1.05);
    expect(convergenceSeconds(close, ideal, [30], options)).toBe(0);
  });

  it('is null when a phase never converges, and the worst phase counts', () => {
    const half = ideal.map((v, i) => (i >= 30 ? v / 2 : v));
    expect(convergenceSeconds(half, ideal, [30], options)).toBeNull();
    const twoPhases = ideal.map((v, i) => (i >= 10 && i < 13 ? 0 : i >= 30 && i < 37 ? 0 : v));
    expect(convergenceSeconds(twoPhases, ideal, [10, 30], options)).toBe(7);
  });

  it('counts from a shift between bin starts without float noise', () => {
    // Shift at 150.1 s (--set shiftAtS=150.1): the first whole bin after it starts at 151 s, 0.9 s later.
    const long = { ...options, fullBins: 300 };
    const flat = new Array<number>(300).fill(20);
    expect(convergenceSeconds(flat, flat, [150.1], long)).toBe(0.9);
    expect(
      sharesSettledSeconds([[0.5, 0.5], ...new Array<number[]>(299).fill([0.9, 0.1])], [150.1], long),
    ).toBe(0.9);
  });

  it('does not call a lucky stretch at the very end convergence', () => {
    const lateLuck = ideal.map((v, i) => (i >= 30 && i < 52 ? v / 2 : v));
    expect(convergenceSeconds(lateLuck, ideal, [30], options)).toBeNull();
    // From the window starting at bin 51 (one half bin in five: 90 against 100, within 10% + slack), 9 bins remain.
    expect(convergenceSeconds(lateLuck, ideal, [30], { ...options, holdBins: 9 })).toBe(21);
  });
});

describe('sharesSettledSeconds', () => {
  const o = { binS: 1, fullBins: 10, holdBins: 3 };
  const still = (share: number, n: number) => Array.from({ length: n }, () => [share, 1 - share]);

  it('is 0 for shares that never move, and null without shares', () => {
    expect(sharesSettledSeconds(still(0.5, 10), [], o)).toBe(0);
    expect(sharesSettledSeconds(undefined, [], o)).toBeNull();
  });

  it('counts from each shift to the first bin from which every region stays within 0.02 of where it ends', () => {
    // Shift at 2 s; moves at bins 2-4, within 0.02 of the final 0.9 from bin 5 (0.89 is close enough).
    const samples = [...still(0.5, 2), [0.7, 0.3], [0.8, 0.2], [0.85, 0.15], [0.89, 0.11], ...still(0.9, 4)];
    expect(sharesSettledSeconds(samples, [2], o)).toBe(3);
    // A second shift at 8 s with nothing moving after it: the worst phase (3 s) counts.
    expect(sharesSettledSeconds(samples, [2, 8], o)).toBe(3);
  });

  it('is null when a phase is still moving in its last hold bins', () => {
    const samples = [...still(0.5, 8), [0.6, 0.4], [0.7, 0.3]];
    expect(sharesSettledSeconds(samples, [], o)).toBeNull();
  });
});
