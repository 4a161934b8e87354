/**
 * The scenarios of issue 13 (homed-tenants, noisy-neighbour, cold-start) and the worst-subject figure each
 * reports: exact where the arithmetic is, deterministic by seed.
 */
import { describe, expect, it } from 'vitest';
import { Random } from '../../../../simulations/engine/random.js';
import { runSimulation } from '../../../../simulations/engine/run.js';
import { Recorder } from '../../../../simulations/metrics/recorder.js';
import type { StrategyResult } from '../../../../simulations/metrics/result.js';
import { findScenario, homesOf } from '../../../../simulations/scenarios/catalogue.js';
import { DEFAULT_SETTINGS, REGION_NAMES, resolveSettings } from '../../../../simulations/settings.js';
import { findStrategy } from '../../../../simulations/strategies/registry.js';
import type { SimRequest } from '../../../../simulations/strategy.js';

function result(
  scenario: string,
  strategy: string,
  set: Record<string, unknown> = {},
  regionCount = 3,
  seed = 1,
): StrategyResult {
  const sc = findScenario(scenario)!;
  return runSimulation({
    scenario: sc,
    strategy: findStrategy(strategy)!,
    regionCount,
    seed,
    settings: resolveSettings(DEFAULT_SETTINGS, sc.defaults, set),
  }).result;
}

const request = (subject: number, at: number, cost = 1): SimRequest => ({
  id: 0,
  at,
  region: 0,
  subject,
  cost,
  attempt: 0,
  source: 0,
});

describe('the worst subject', () => {
  it('is the smallest admitted fraction of what the oracle admitted, after the warm-up, among subjects that matter', () => {
    const r = new Recorder(10, 1, 0, 1);
    const offer = (subject: number, at: number, ideal: boolean, allowed: boolean) => {
      const req = request(subject, at);
      r.offered(req, ideal);
      r.completed(req, { allowed, retryAfterMs: 0, decidedAt: at }, ideal, at);
    };
    // Subject 1: the oracle admits 20 after the warm-up, the strategy 15 (and 5 more before 1 s: not counted).
    for (let i = 0; i < 5; i++) offer(1, 100_000, true, true);
    for (let i = 0; i < 20; i++) offer(1, 2_000_000, true, i < 15);
    // Subject 2: 12 of 12.
    for (let i = 0; i < 12; i++) offer(2, 3_000_000, true, true);
    // Subject 3: nothing of 4, but 4 tokens are too few to say anything about a budget.
    for (let i = 0; i < 4; i++) offer(3, 3_000_000, true, false);
    expect(r.worstSubject(10)).toEqual({ subject: 1, admittedFraction: 0.75, idealAdmittedCost: 20 });
    expect(r.worstSubject(4)).toEqual({ subject: 3, admittedFraction: 0, idealAdmittedCost: 4 });
    expect(r.worstSubject(100)).toBeNull();
  });
});

describe('homed-tenants', () => {
  it('spreads homes exactly by the split, largest remainder first, none past the list', () => {
    const count = (homes: number[], n: number) =>
      Array.from({ length: n }, (_, r) => homes.filter((h) => h === r).length);
    expect(count(homesOf(10, '70/20/10', 3), 3)).toEqual([7, 2, 1]);
    expect(count(homesOf(7, '70/20/10', 3), 3)).toEqual([5, 1, 1]);
    expect(count(homesOf(10, '70/20/10', 5), 5)).toEqual([7, 2, 1, 0, 0]);
    expect(count(homesOf(10, '70/20/10', 2), 2)).toEqual([8, 2]);
    expect(homesOf(3, '70/20/10', 3)).toEqual([0, 0, 1]);
  });

  it('a fixed split gives every homed tenant a third of its budget; each subject sends from its home only', () => {
    const r = result('homed-tenants', 'static', { durationS: 120 });
    expect(r.worstSubject!.admittedFraction).toBeCloseTo(1 / 3, 2);
    expect(r.utilisation).toBeCloseTo(1 / 3, 2);
    // Ten subjects at 1.5 R = 3 tokens/s each for 120 s: about 3,600 requests.
    expect(r.arrivals).toBeGreaterThan(3300);
    expect(r.arrivals).toBeLessThan(3900);
  });

  it('is deterministic by seed', () => {
    const a = result('homed-tenants', 'dynamic', { durationS: 60 }, 3, 4);
    const b = result('homed-tenants', 'dynamic', { durationS: 60 }, 3, 4);
    const c = result('homed-tenants', 'dynamic', { durationS: 60 }, 3, 5);
    expect(b).toEqual(a);
    expect(c.arrivals).not.toBe(a.arrivals);
  });
});

describe('noisy-neighbour', () => {
  it('a fixed split holds every quiet tenant to a third of its budget; the noisy one cannot take more than its own', () => {
    const r = result('noisy-neighbour', 'static', { durationS: 120 });
    expect(r.worstSubject!.admittedFraction).toBeCloseTo(1 / 3, 1);
    const ideal = result('noisy-neighbour', 'ideal', { durationS: 120 });
    expect(ideal.worstSubject!.admittedFraction).toBe(1);
    expect(ideal.overAdmission).toBeLessThanOrEqual(1);
  });

  it('the quiet tenants keep their share under dynamic: the noisy one adds only its own rate to demand', () => {
    const r = result('noisy-neighbour', 'dynamic', { durationS: 120 });
    const stat = result('noisy-neighbour', 'static', { durationS: 120 });
    expect(r.utilisation!).toBeGreaterThanOrEqual(stat.utilisation!);
    expect(r.maxShareSum).toBeLessThanOrEqual(1);
    expect(r.overAdmission).toBeLessThanOrEqual(1);
  });
});

describe('cold-start', () => {
  it('sends nothing during the idle spell and the same as before once it resumes', () => {
    const sc = findScenario('cold-start')!;
    const s = resolveSettings(DEFAULT_SETTINGS, sc.defaults, { durationS: 150 });
    const plan = sc.plan(REGION_NAMES.slice(0, 3), s);
    expect(plan.shiftsS).toEqual([90]);
    for (const source of plan.sources) {
      const random = new Random(1, `region-${source.region}`);
      const counts = [0, 0, 0];
      for (let t = source.nextArrival(0, random); t !== Infinity; t = source.nextArrival(t, random))
        counts[t < 60e6 ? 0 : t < 90e6 ? 1 : 2]!++;
      expect(counts[1]).toBe(0);
      // 10 subjects × 3 tokens/s over 3 regions: 10 a second in each region, for 60 s before and after.
      expect(counts[0]).toBeGreaterThan(550);
      expect(counts[2]).toBeGreaterThan(550);
      expect(counts[0]).toBeLessThan(650);
      expect(counts[2]).toBeLessThan(650);
    }
  });

  it('identical demand resuming in every region moves no share under dynamic', () => {
    const r = result('cold-start', 'dynamic', { durationS: 150 });
    // The policy's shares in force never leave the even split (settled from the start of every phase).
    expect(r.sharesSettledSeconds).toBe(0);
    expect(r.maxShareSum).toBe(1);
    const stat = result('cold-start', 'static', { durationS: 150 });
    expect(r.utilisation!).toBeGreaterThan(stat.utilisation! - 0.01);
  });
});
