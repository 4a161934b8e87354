/**
 * Subject classes in the simulator (simulations/engine/subject-classes.ts, the `tiered-tenants` scenario): every
 * strategy and the ideal oracle size an enterprise subject by its class, over-admission is measured against each
 * subject's own limits, the simulated agents count its demand up to its class's rate (core/shares/usage-accounting.ts)
 * and borrow by its class, so shares follow enterprise traffic and delivery holds per subject.
 */
import { describe, expect, it } from 'vitest';
import { runSimulation, simPolicy } from '../../../../simulations/engine/run.js';
import { enterpriseSubjectIds, SubjectPolicies } from '../../../../simulations/engine/subject-classes.js';
import { AdmissionLog, overAdmission } from '../../../../simulations/metrics/over-admission.js';
import { findScenario } from '../../../../simulations/scenarios/catalogue.js';
import { DEFAULT_SETTINGS, REGION_NAMES, resolveSettings } from '../../../../simulations/settings.js';
import { findStrategy } from '../../../../simulations/strategies/registry.js';

const scenario = findScenario('tiered-tenants')!;
const settings = (set: Record<string, unknown> = {}) =>
  resolveSettings(DEFAULT_SETTINGS, scenario.defaults, set);

function run(strategy: string, set: Record<string, unknown> = {}) {
  return runSimulation({
    scenario,
    strategy: findStrategy(strategy)!,
    regionCount: 3,
    seed: 1,
    settings: settings({ durationS: 120, ...set }),
  });
}

describe('subject classes in the simulator', () => {
  it('gives the last enterpriseSubjects subjects a class of enterpriseFactor × C and × R', () => {
    const s = settings();
    expect(enterpriseSubjectIds(s)).toEqual([8, 9]);
    const policy = simPolicy(s, findStrategy('dynamic')!, REGION_NAMES.slice(0, 3));
    expect(policy.classes).toEqual({ enterprise: { capacity: 1000, refillPerSecond: 20, maxCost: 1 } });
    const policies = new SubjectPolicies(policy);
    expect([policies.of(9).capacity, policies.of(9).refillPerSecond]).toEqual([1000, 20]);
    expect(policies.of(7)).toBe(policy);
    // Without enterprise subjects the policy has no classes: every other scenario runs as before.
    expect(
      simPolicy(resolveSettings(DEFAULT_SETTINGS), findStrategy('dynamic')!, ['us']).classes,
    ).toBeUndefined();
  });

  it('refuses more enterprise subjects than subjects, and classes on the log kinds', () => {
    expect(() => settings({ enterpriseSubjects: 11 })).toThrow(
      /enterpriseSubjects \(11\) must be ≤ subjects/,
    );
    expect(() => settings({ kind: 'sliding_log' })).toThrow(/simulated for token buckets/);
  });

  it("measures a subject of a class against its class's C + R·W", () => {
    const log = new AdmissionLog();
    for (let i = 0; i < 1000; i++) log.add(9, 0, 1_000_000);
    const enterprise = { capacity: 1000, refillPerSecond: 20 };
    expect(overAdmission(log, 100, 2, undefined, () => enterprise).byWindow['1s']).toBe(1000 / 1020);
    // Measured against the policy's own limits, the same admissions are 9.8 times the budget.
    expect(overAdmission(log, 100, 2).byWindow['1s']).toBe(1000 / 102);
  });

  it('the ideal oracle admits each enterprise tenant up to its class: C + R·T each, 10× a default tenant', () => {
    const { result } = run('ideal');
    // 8 default tenants at most 100 + 2 × 120 = 340 each, 2 enterprise ones at most 1000 + 20 × 120 = 3400.
    expect(result.idealAdmittedCost).toBeLessThanOrEqual(8 * 340 + 2 * 3400);
    expect(result.idealAdmittedCost).toBeGreaterThan(9300);
    expect(result.overAdmission).toBeLessThanOrEqual(1);
  });

  it('dynamic conserves per subject and delivers ≥ 0.95 of the ideal to every tenant (0.969 overall, worst 0.967)', () => {
    const { result } = run('dynamic');
    expect(result.overAdmission).toBeLessThanOrEqual(1);
    expect(result.maxShareSum).toBeLessThanOrEqual(1);
    expect(result.shareSumAboveOneS).toBe(0);
    expect(result.utilisation).toBeGreaterThanOrEqual(0.95);
    expect(result.worstSubject!.admittedFraction).toBeGreaterThanOrEqual(0.95);
    // A fixed split holds every tenant to a third.
    expect(run('static').result.utilisation).toBeLessThan(0.34);
  });

  it('without borrowing, shares follow enterprise demand to the regions its tenants are homed in', () => {
    // Demand by region (us, eu, ap): 7 R, R + 10 R, 10 R. Counted at the policy's R, the enterprise tenants
    // would add R each and the shares would lean to us (0.49, 0.31, 0.20 at the end of a 300 s run).
    const { series, result } = run('dynamic', { borrowing: 'off' });
    const [us, eu, ap] = series.shares![series.shares!.length - 1]!;
    expect(eu!).toBeGreaterThan(us!);
    expect(ap!).toBeGreaterThan(us!);
    expect(eu! + ap!).toBeGreaterThanOrEqual(0.7);
    expect(result.maxShareSum).toBeLessThanOrEqual(1);
    expect(result.overAdmission).toBeLessThanOrEqual(1);
  });
});
