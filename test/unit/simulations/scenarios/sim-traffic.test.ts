import { describe, expect, it } from 'vitest';
import { Random } from '../../../../simulations/engine/random.js';
import {
  bursts,
  oneShotSubjects,
  poisson,
  uniformCost,
  weightedSubjects,
  zipfWeights,
} from '../../../../simulations/scenarios/traffic.js';

function arrivals(source: ReturnType<typeof poisson>, random: Random): number[] {
  const out: number[] = [];
  for (let t = source.nextArrival(0, random); t < Infinity; t = source.nextArrival(t, random)) out.push(t);
  return out;
}

describe('scenario traffic', () => {
  it('draws Poisson arrivals at the asked rate, following a time-varying rate by thinning', () => {
    const constant = poisson({
      region: 0,
      rate: () => 50,
      maxRate: 50,
      endS: 200,
      subjects: { pick: () => 0 },
      cost: () => 1,
    });
    const times = arrivals(constant, new Random(1, 'p'));
    // 10,000 expected; a Poisson count has sd 100.
    expect(times.length).toBeGreaterThan(9600);
    expect(times.length).toBeLessThan(10400);
    expect(times.every((t, i) => i === 0 || t > times[i - 1]!)).toBe(true);
    const step = poisson({
      region: 0,
      rate: (t) => (t < 100 ? 10 : 90),
      maxRate: 90,
      endS: 200,
      subjects: { pick: () => 0 },
      cost: () => 1,
    });
    const stepped = arrivals(step, new Random(2, 'p'));
    const early = stepped.filter((t) => t < 100e6).length;
    expect(early).toBeGreaterThan(850);
    expect(early).toBeLessThan(1150);
    expect(stepped.length - early).toBeGreaterThan(8600);
    expect(stepped.length - early).toBeLessThan(9400);
  });

  it('emits bursts of exactly `count` requests at each boundary, evenly spread', () => {
    const source = bursts({
      region: 1,
      everyS: 60,
      firstS: 0,
      count: 4,
      spreadMs: 200,
      endS: 180,
      subjects: { pick: () => 3 },
      cost: () => 1,
    });
    const times = arrivals(source, new Random(1, 'b'));
    expect(times).toEqual([
      0,
      50_000,
      100_000,
      150_000,
      60e6,
      60e6 + 50_000,
      60e6 + 100_000,
      60e6 + 150_000,
      120e6,
      120e6 + 50_000,
      120e6 + 100_000,
      120e6 + 150_000,
    ]);
  });

  it('picks subjects by weight (Zipf), one-shot identities once each, costs within 1..maxCost', () => {
    const random = new Random(3, 's');
    const picker = weightedSubjects(zipfWeights(10, 1));
    const counts = new Array<number>(10).fill(0);
    for (let i = 0; i < 100_000; i++) counts[picker.pick(random)]!++;
    // Zipf(1) over 10: p1 = 1 / H10 = 0.3414, p2 = p1 / 2.
    expect(counts[0]! / 100_000).toBeCloseTo(0.3414, 2);
    expect(counts[1]! / counts[0]!).toBeCloseTo(0.5, 1);
    const fresh = oneShotSubjects(1000);
    expect([fresh.pick(random), fresh.pick(random), fresh.pick(random)]).toEqual([1000, 1001, 1002]);
    const cost = uniformCost(5);
    const costs = new Set(Array.from({ length: 1000 }, () => cost(random)));
    expect([...costs].sort()).toEqual([1, 2, 3, 4, 5]);
    expect(uniformCost(1)(random)).toBe(1);
  });
});
