/**
 * The checks that keep the simulator honest: known outcomes of known strategies on the scenarios of docs/design.md,
 * with bounds that follow from the bucket arithmetic, on short runs (seconds of CPU in all).
 */
import { describe, expect, it } from 'vitest';
import { runSimulation, type RunOutput } from '../../../../simulations/engine/run.js';
import type { StrategyResult } from '../../../../simulations/metrics/result.js';
import { StrategyResult as StrategyResultSchema } from '../../../../simulations/metrics/result.js';
import { findScenario, scenarios } from '../../../../simulations/scenarios/catalogue.js';
import { DEFAULT_SETTINGS, resolveSettings } from '../../../../simulations/settings.js';
import { findStrategy, strategies } from '../../../../simulations/strategies/registry.js';

function run(
  scenario: string,
  strategy: string,
  set: Record<string, unknown> = {},
  regionCount = 3,
): RunOutput {
  const sc = findScenario(scenario)!;
  return runSimulation({
    scenario: sc,
    strategy: findStrategy(strategy)!,
    regionCount,
    seed: 11,
    settings: resolveSettings(DEFAULT_SETTINGS, sc.defaults, set),
  });
}
const result = (...args: Parameters<typeof run>): StrategyResult => run(...args).result;

describe('minute-burst with 3 regions', () => {
  const set = { durationS: 180 };
  it('independent over-admits about 3× (every region grants a full burst at once)', () => {
    const r = result('minute-burst', 'independent', set);
    // 3 regions × C = 300 in a second where the budget allows C + R = 102: 2.94.
    expect(r.overAdmission).toBeGreaterThan(2.8);
    expect(r.overAdmission).toBeLessThanOrEqual(3);
    expect(r.worstWindow?.windowS).toBe(1);
    expect(r.utilisation).toBeCloseTo(3, 1);
  });

  it('static never exceeds 1 without failures, nor does strict or ideal', () => {
    for (const name of ['static', 'strict', 'ideal']) {
      const r = result('minute-burst', name, set);
      expect(r.overAdmission, name).toBeLessThanOrEqual(1);
      expect(r.overAdmission, name).toBeGreaterThan(0.9);
    }
  });
});

describe('every scenario under every strategy', () => {
  for (const scenario of scenarios) {
    it(scenario.name, () => {
      const byStrategy = new Map<string, StrategyResult>();
      const set = { durationS: 120, faultAtS: 30, shiftAtS: 60, warmupS: 0 };
      const settings = resolveSettings(DEFAULT_SETTINGS, scenario.defaults, set);
      for (const strategy of strategies) {
        // strict cannot enforce a concurrency policy (docs/concurrency.md): the CLI leaves it out too.
        if (strategy.cannotEnforce?.(settings) !== undefined) {
          expect([strategy.name, settings.kind]).toEqual(['strict', 'concurrency']);
          continue;
        }
        const r = result(scenario.name, strategy.name, set);
        StrategyResultSchema.parse(r);
        byStrategy.set(strategy.name, r);
        expect(r.admitted + r.denied + (r.counters['unfinished'] ?? 0), strategy.name).toBe(r.requests);
        expect(r.requests, strategy.name).toBeGreaterThan(100);
        expect(r.arrivals + r.retries).toBe(r.requests);
      }
      const ideal = byStrategy.get('ideal')!;
      // The oracle is its own shadow: it admits exactly what it admits.
      expect(ideal.utilisation).toBe(1);
      expect(ideal.falseDenialRate).toBe(0);
      expect(ideal.falseAdmissionRate).toBe(0);
      // Admitted = ideal's admissions − false denials + false admissions, request for request.
      for (const r of byStrategy.values())
        expect(r.admitted, r.strategy).toBe(r.idealAdmitted - r.falseDenials + r.falseAdmissions);
      expect(ideal.overAdmission).toBeLessThanOrEqual(1);
      // Without failures of their own stores, conserving strategies stay within the budget.
      if (scenario.name !== 'redis-failover') {
        for (const name of ['static', 'strict', 'dynamic'])
          expect(byStrategy.get(name)?.overAdmission ?? 0, name).toBeLessThanOrEqual(1);
      }
      expect(byStrategy.get('static')!.maxShareSum).toBeCloseTo(1, 9);
      expect(byStrategy.get('independent')!.maxShareSum).toBe(3);
      expect(byStrategy.get('independent')!.shareSumAboveOneS).toBe(120);
      expect(byStrategy.get('strict')?.maxShareSum ?? 1).toBe(1);
      // The protocol's shares in force never sum above 1, whatever the scenario; the naive rebalancer's may.
      expect(byStrategy.get('dynamic')!.maxShareSum).toBeLessThanOrEqual(1);
      expect(byStrategy.get('dynamic')!.shareSumAboveOneS).toBe(0);
      expect(byStrategy.get('naive-dynamic')!.maxShareSum).toBeGreaterThanOrEqual(1 - 1e-9);
      for (const name of ['dynamic', 'naive-dynamic']) {
        expect(byStrategy.get(name)!.controlMessagesPerSecond, name).toBeGreaterThan(0);
      }
      // Only a request that waits for a borrow waits at all, and never past its decision deadline.
      expect(byStrategy.get('naive-dynamic')!.latencyMs.max).toBe(0);
      expect(byStrategy.get('dynamic')!.latencyMs.max).toBeLessThanOrEqual(DEFAULT_SETTINGS.forwardTimeoutMs);
      expect(byStrategy.get('dynamic')!.network.data).toBe(0);
      expect(ideal.maxShareSum).toBeNull();
      expect(ideal.shareSumAboveOneS).toBeNull();
      for (const name of ['ideal', 'independent', 'static']) {
        expect(byStrategy.get(name)!.latencyMs.max, name).toBe(0);
        expect(byStrategy.get(name)!.network.data, name).toBe(0);
      }
    });
  }
});

describe('step-shift', () => {
  it('static strands the budget in the regions demand left: utilisation near 1/N; independent keeps up', () => {
    const staticRun = result('step-shift', 'static');
    const independent = result('step-shift', 'independent');
    expect(staticRun.utilisation).toBeGreaterThan(0.3);
    expect(staticRun.utilisation).toBeLessThan(0.45);
    expect(staticRun.convergenceSeconds).toBeNull();
    expect(independent.utilisation).toBeGreaterThanOrEqual(1);
    expect(result('step-shift', 'ideal').convergenceSeconds).toBe(0);
  });
});

describe('strict mode', () => {
  it('pays exactly one round trip for forwarded decisions without jitter', () => {
    const r = result('uniform', 'strict', { durationS: 60, linkJitterMs: 0, linkDelayMs: 40 });
    expect(r.forwardedLatencyMs).toEqual({ p50: 80, p99: 80, max: 80 });
    // A third of the requests arrive in the home region and answer at once.
    expect(r.latencyMs.p50).toBe(80);
    expect(r.forwardedMessagesPerSecond).toBeGreaterThan(0);
    // No loss: every forwarded decision is one request and one reply; two regions of three forward.
    expect(r.network.data).toBe(2 * r.forwarded);
    expect(r.forwarded / r.requests).toBeGreaterThan(0.63);
    expect(r.forwarded / r.requests).toBeLessThan(0.7);
    expect(r.network.lost + r.network.dropped).toBe(0);
  });

  it('uses per-link overrides, and refuses links to regions the run does not have', () => {
    const r = result('uniform', 'strict', { durationS: 60, linkJitterMs: 0, links: 'us-eu=10/0/0' }, 2);
    expect(r.forwardedLatencyMs).toEqual({ p50: 20, p99: 20, max: 20 });
    expect(() => result('uniform', 'strict', { durationS: 60, links: 'us-sa=10/0/0' })).toThrow(
      /links: unknown region sa/,
    );
  });

  it('reports jitter in p50 and p99 of the round trip', () => {
    const r = result('uniform', 'strict', { durationS: 60, linkJitterMs: 5, linkDelayMs: 40 });
    // Two exponential jitters of mean 5 ms: median ≈ 8.4 ms, p99 ≈ 33 ms above the 80 ms floor.
    expect(r.forwardedLatencyMs!.p50).toBeGreaterThan(85);
    expect(r.forwardedLatencyMs!.p50).toBeLessThan(92);
    expect(r.forwardedLatencyMs!.p99).toBeGreaterThan(100);
    expect(r.forwardedLatencyMs!.p99).toBeLessThan(125);
  });

  it('fails closed on loss: a lost request or reply is a denial after the timeout, and a lost reply wastes a grant', () => {
    const r = result('uniform', 'strict', { durationS: 120, linkLoss: 0.1, load: 0.5 });
    const forwarded = r.forwarded;
    const unreachable = r.degraded['home_unreachable']!;
    // 1 − 0.9² = 19% of forwarded decisions lose a message.
    expect(unreachable / forwarded).toBeGreaterThan(0.15);
    expect(unreachable / forwarded).toBeLessThan(0.23);
    expect(r.forwardedLatencyMs!.max).toBe(250);
    expect(r.counters['lostGrants']).toBeGreaterThan(0);
    expect(r.counters['lostGrants']).toBeLessThan(unreachable);
    expect(r.denied).toBeGreaterThanOrEqual(unreachable);
    // At half the budget the oracle admits nearly everything: the timeouts show up as false denials.
    expect(r.falseDenials).toBeGreaterThan(0.9 * unreachable);
  });

  it('denies what a partitioned region forwards, and decides from the emergency bucket with onStoreFailure=local', () => {
    const closed = result('region-partition', 'strict', { durationS: 120, faultAtS: 30, faultForS: 30 });
    expect(closed.degraded['home_unreachable']).toBeGreaterThan(0);
    expect(closed.forwardedLatencyMs!.max).toBe(250);
    const local = result('region-partition', 'strict', {
      durationS: 120,
      faultAtS: 30,
      faultForS: 30,
      onStoreFailure: 'local',
    });
    expect(local.degraded['home_unreachable']).toBeUndefined();
    expect(local.degraded['emergency_bucket']).toBe(closed.degraded['home_unreachable']);
    expect(local.admitted).toBeGreaterThan(closed.admitted);
    // The regional strategies do not notice a partition.
    expect(result('region-partition', 'static', { durationS: 120, faultAtS: 30 }).degraded).toEqual({});
  });
});

describe('redis-failover (lost writes)', () => {
  it('over-admits when the replica comes up empty, by about the failed region’s share of C', () => {
    const full = result('redis-failover', 'static', { failoverReset: 'full', durationS: 120 });
    // 100 + 2·60 in the first minute, plus a third of C again after the reset: (220 + 33) / 220 ≈ 1.15.
    expect(full.overAdmission).toBeGreaterThan(1.05);
    expect(full.overAdmission).toBeLessThan(1.2);
    expect(full.counters['fault:redis-failover']).toBe(1);
  });

  it('loses nothing when the replica lost no writes', () => {
    const none = result('redis-failover', 'static', { failoverLagS: 0, durationS: 120 });
    const base = result('redis-failover', 'static', { failoverLagS: 0, faultAtS: 119, durationS: 120 });
    expect(none.overAdmission).toBeLessThanOrEqual(1);
    expect(none.admitted).toBe(base.admitted);
  });
});

describe('client behaviour and bounded state', () => {
  it('clients ignoring Retry-After multiply requests, not admissions', () => {
    const r = result('ignore-retry-after', 'static', { durationS: 120 });
    expect(r.retries).toBeGreaterThan(r.arrivals);
    expect(r.overAdmission).toBeLessThanOrEqual(1);
    expect(r.utilisation).toBeGreaterThan(0.9);
  });

  it('one-shot identities level off at rate × idle TTL live keys per region', () => {
    const r = result('one-shot-identities', 'static', { durationS: 240, oneShotRate: 150 });
    // 50 new keys/s per region, each living 60 s (the policy's idle TTL): about 3,000, never growing past it.
    for (const [region, peak] of Object.entries(r.peakKeys)) {
      expect(peak, region).toBeGreaterThan(2700);
      expect(peak, region).toBeLessThan(3400);
    }
  });

  it('refuses a split that leaves a region unable to admit the largest cost', () => {
    expect(() => result('uniform', 'static', { capacity: 2, maxCost: 1 })).toThrow(/less than maxCost/);
  });
});
