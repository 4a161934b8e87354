/**
 * The dynamic strategies in the simulator: `dynamic` runs core's conservation protocol (LeaseCoordinator,
 * AgentLease) over the simulated network; `naive-dynamic` the same rebalancer without the two-phase protocol.
 * The checks of issue 5 (minute-burst, step-shift, coordinator crash, region partition), what naive-dynamic
 * costs, the wire, the message count and the settings.
 */
import { describe, expect, it } from 'vitest';
import { AllocationRecord, Ack, Heartbeat, RenewalReply, Usage } from '../../../../core/wire/protocol.js';
import { DemandSnapshot } from '../../../../core/lease/demand-snapshot.js';
import { parseCli } from '../../../../simulations/cli-args.js';
import type { ProtocolMessage } from '../../../../simulations/dynamic/control-plane.js';
import { runSimulation, type RunOutput } from '../../../../simulations/engine/run.js';
import type { StrategyResult } from '../../../../simulations/metrics/result.js';
import { findScenario } from '../../../../simulations/scenarios/catalogue.js';
import { DEFAULT_SETTINGS, resolveSettings } from '../../../../simulations/settings.js';
import { planRuns } from '../../../../simulations/simulate.js';
import { dynamic, DynamicStrategy } from '../../../../simulations/strategies/dynamic.js';
import { findStrategy } from '../../../../simulations/strategies/registry.js';
import type { StrategyDefinition } from '../../../../simulations/strategy.js';

function run(
  scenario: string,
  strategy: string | StrategyDefinition,
  set: Record<string, unknown> = {},
  regionCount = 3,
  seed = 11,
): RunOutput {
  const sc = findScenario(scenario)!;
  return runSimulation({
    scenario: sc,
    strategy: typeof strategy === 'string' ? findStrategy(strategy)! : strategy,
    regionCount,
    seed,
    settings: resolveSettings(DEFAULT_SETTINGS, sc.defaults, set),
  });
}
const result = (...args: Parameters<typeof run>): StrategyResult => run(...args).result;

/** `dynamic`, with every protocol message handed to `seen` as it is sent. */
function watched(seen: (m: ProtocolMessage) => void): StrategyDefinition {
  return {
    ...dynamic,
    create() {
      const inner = new DynamicStrategy();
      return {
        start(ctx) {
          inner.start(ctx);
          inner.plane!.onMessage = seen;
        },
        decide: (r) => inner.decide(r),
        shares: () => inner.shares(),
        onFault: (f) => inner.onFault(f),
        finish: () => inner.finish(),
      };
    },
  };
}

/**
 * The protocol's machinery at full stretch: by default a move waits a minute for a split of demand that lasts
 * (borrowing serves the subjects meanwhile) and per-subject overrides are off; the checks of the protocol itself
 * want moves and overrides within these short runs.
 */
const MOVING = { confirmMs: 2000, maxOverrides: 16 };

/** Conservation as the run measured it: never above 1, not for an instant. */
function conserved(r: StrategyResult): void {
  expect(r.maxShareSum, `${r.scenario}/${r.strategy}`).toBeLessThanOrEqual(1);
  expect(r.shareSumAboveOneS, `${r.scenario}/${r.strategy}`).toBe(0);
}

describe('dynamic: the checks of issue 5', () => {
  it('on minute-burst with 3 regions, never exceeds the budget without failures', () => {
    const r = result('minute-burst', 'dynamic', { durationS: 180 });
    expect(r.overAdmission).toBeLessThanOrEqual(1);
    expect(r.overAdmission).toBeGreaterThan(0.9);
    conserved(r);
    // Every agent held a lease throughout: no decision failed closed for want of one.
    expect(r.degraded).toEqual({});
    expect(r.counters['coordinatorStarts']).toBe(1);
  });

  it('on step-shift, follows the demand: shares move to the new region and it admits far more than static', () => {
    const { result: r, series } = run('step-shift', 'dynamic');
    const staticRun = result('step-shift', 'static');
    expect(r.utilisation!).toBeGreaterThan(staticRun.utilisation! + 0.3);
    // Issue 5's check: at least 0.9 of ideal (counted from warmupS = 120 s); borrowing delivers the start-up
    // burst too (the other regions lend their thirds of it), so the whole run reaches it as well.
    expect(r.utilisation!).toBeGreaterThanOrEqual(0.95);
    expect(r.utilisationWholeRun!).toBeGreaterThanOrEqual(0.95);
    // Before the shift (all demand in us) and once the move is confirmed after it (a minute beyond the band: all
    // in eu), at the floor elsewhere; borrowing served eu meanwhile.
    const before = series.shares![140]!;
    const after = series.shares![230]!;
    expect(before[0]).toBeGreaterThan(0.9);
    expect(after[1]).toBeGreaterThan(0.85);
    expect(after[2]).toBeCloseTo(0.02, 9);
    conserved(r);
    expect(r.overAdmission).toBeLessThanOrEqual(1);
  });

  it('through a coordinator crash: leases lapse to the safe shares, learning mode, then shares follow demand again', () => {
    const { result: r, series } = run('coordinator-crash', 'dynamic', { ...MOVING, standbyAfterS: 0 });
    conserved(r);
    expect(r.counters['coordinatorStarts']).toBe(2);
    // Down from 120 s to 180 s: after lease (6 s) and grace (12 s) every agent decides at its safe share.
    for (const share of series.shares![150]!) expect(share).toBeCloseTo(1 / 3, 9);
    // Back at 180 s, learning until every agent holds its renewal (three report intervals after the first heartbeat,
    // about 183 s; a lease and the skew, 187 s, at most), then eu, where the demand is, grows.
    expect(series.shares![182]![1]).toBeCloseTo(1 / 3, 9);
    expect(series.shares![185]![1]).toBeGreaterThan(0.8);
    expect(series.shares![200]![1]).toBeGreaterThan(0.8);
    expect(r.overAdmission).toBeLessThanOrEqual(1);
  });

  it('through a coordinator crash with a standby: it leads after its lease, from the KV, and the budget holds', () => {
    const without = run('coordinator-crash', 'dynamic', { ...MOVING, standbyAfterS: 0 }).result;
    const { result: r } = run('coordinator-crash', 'dynamic', { ...MOVING, standbyAfterS: 10 });
    conserved(r);
    // The standby starts at 130 s; the crashed coordinator, back at 180 s, finds the lease held and stays standby.
    expect(r.counters['standbyTakeovers']).toBe(1);
    expect(r.counters['coordinatorStarts']).toBe(2);
    expect(r.overAdmission).toBeLessThanOrEqual(1);
    expect(r.utilisation!).toBeGreaterThan(without.utilisation!);
  });

  it('through a region partition: the cut region settles at its safe share, the others share the rest', () => {
    const { result: r, series } = run('region-partition', 'dynamic', { maxOverrides: 0 });
    conserved(r);
    // ap is cut off from 120 s to 180 s.
    const during = series.shares![170]!;
    expect(during[2]).toBeCloseTo(1 / 3, 9);
    expect(during[0]! + during[1]! + during[2]!).toBeGreaterThan(0.99);
    expect(r.network.dropped).toBeGreaterThan(0);
    // Healed, it is renewed and grows back toward its (even) demand.
    expect(series.shares![210]![2]).toBeGreaterThan(0.25);
    expect(r.overAdmission).toBeLessThanOrEqual(1);
  });

  it('conserves the budget under loss and jitter, with several agents per region', () => {
    for (const scenario of ['follow-the-sun', 'region-partition', 'coordinator-crash']) {
      const r = result(scenario, 'dynamic', {
        ...MOVING,
        durationS: 240,
        linkLoss: 0.2,
        linkJitterMs: 40,
        agentsPerRegion: 2,
      });
      conserved(r);
      expect(r.network.lost, scenario).toBeGreaterThan(100);
      // Watches that lost an entry caught up on their own.
      expect(r.counters['watchResyncs'], scenario).toBeGreaterThan(0);
    }
    // Three scenarios of 240 s with several agents per region, message by message: 10 s at a load average
    // above 20 on two cores, and past the default 20 s on a CI run.
  }, 60_000);
});

describe('naive-dynamic: what the two-phase protocol buys', () => {
  it('puts shares in force above 1 from message delay alone, where dynamic never does', () => {
    // Steps of 85% of the gap: small steps (the default maxStep, 0.05) also bound what a delay can overlap.
    const naive = result('follow-the-sun', 'naive-dynamic', { ...MOVING, durationS: 150, maxStep: 1 });
    expect(naive.maxShareSum!).toBeGreaterThan(1.2);
    expect(naive.shareSumAboveOneS!).toBeGreaterThan(0);
    conserved(result('follow-the-sun', 'dynamic', { ...MOVING, durationS: 150 }));
  });

  it('keeps a partitioned region at its share: its demand is unknown, not zero, so nothing is given away', () => {
    // Refill large against burst, so a long window would show extra refill; even demand above the budget.
    // Before demand knew "unknown", naive-dynamic handed the cut region's share to the others (sum 1.4, 1.2×).
    const set = { capacity: 50, refillPerSecond: 20, load: 3, durationS: 150, faultAtS: 60 };
    const naive = result('region-partition', 'naive-dynamic', set);
    expect(naive.maxShareSum).toBe(1);
    expect(naive.shareSumAboveOneS).toBe(0);
    expect(naive.overAdmission).toBeLessThanOrEqual(1);
    const protocol = result('region-partition', 'dynamic', set);
    conserved(protocol);
    expect(protocol.overAdmission).toBeLessThanOrEqual(1);
  });
});

describe('the protocol on the wire', () => {
  it('sends only messages the core wire schemas accept', () => {
    const counts = new Map<string, number>();
    const check = (m: ProtocolMessage) => {
      counts.set(m.kind, (counts.get(m.kind) ?? 0) + 1);
      const schema = {
        heartbeat: Heartbeat,
        usage: Usage,
        ack: Ack,
        renewal: RenewalReply,
        record: AllocationRecord.nullable(),
        snapshot: DemandSnapshot.nullable(),
      }[m.kind];
      schema.parse(m.body);
    };
    run('follow-the-sun', watched(check), { ...MOVING, durationS: 60, agentsPerRegion: 2 });
    for (const kind of ['heartbeat', 'usage', 'ack', 'renewal', 'record', 'snapshot'])
      expect(counts.get(kind), kind).toBeGreaterThan(0);
  });

  it('counts every heartbeat, renewal, usage report and watch heartbeat as control messages, exactly', () => {
    // One region: nothing to rebalance, so no record is written after the start.
    const r = result('uniform', 'dynamic', { durationS: 30, agentsPerRegion: 2 }, 1);
    expect(r.counters['recordWrites']).toBe(1);
    // Per agent: 30 intervals of usage + heartbeat + renewal, and a watch heartbeat every 5 s; and the
    // coordinator's demand snapshot, one put every 5 s from its first round.
    expect(r.network.control).toBe(2 * (30 * 3 + 30 / 5) + 30 / 5);
    expect(r.controlMessagesPerSecond).toBeCloseTo((2 * 96 + 6) / 30, 6);
  });

  it('counts record writes, deliveries and acknowledgements too', () => {
    const kinds = new Map<string, number>();
    const r = run(
      'step-shift',
      watched((m) => kinds.set(m.kind, (kinds.get(m.kind) ?? 0) + 1)),
      { ...MOVING, durationS: 30, shiftAtS: 29, warmupS: 0 },
      2,
    ).result;
    const writes = r.counters['recordWrites']! - 1; // the first is written before the run
    expect(writes).toBeGreaterThan(0);
    // Each write: coordinator → KV, KV → coordinator (its revision), and one delivery per agent.
    expect(kinds.get('record')).toBe(2 * writes);
    const perAgent = 30 * 3 + 30 / 5;
    // And loans: a request and its reply each.
    const loans = r.counters['loanMessages'] ?? 0;
    // And the demand snapshots: one put each (every 5 s).
    expect(kinds.get('snapshot')).toBe(30 / 5);
    expect(r.network.control).toBe(
      2 * perAgent + 2 * writes + kinds.get('record')! + kinds.get('ack')! + loans + kinds.get('snapshot')!,
    );
  });
});

describe('settings', () => {
  const plan = (...argv: string[]) => {
    const p = parseCli(['--scenario', 'uniform', '--strategies', 'dynamic', ...argv]);
    if (p.help) throw new Error('help');
    return planRuns(p);
  };

  it('refuses what the protocol would refuse, with the reason, before any run', () => {
    expect(() => plan('--set', 'graceMs=5000')).toThrow(/graceMs must be longer than leaseMs/);
    expect(() => plan('--set', 'graceMs=8000')).toThrow(
      /graceMs \(8000\) must exceed leaseMs \+ 2 × skewMs \+ roundMs \(9000\)/,
    );
    expect(() => plan('--set', 'reportIntervalMs=4000')).toThrow(
      /leaseMs must be at least 3 × reportIntervalMs \+ skewMs/,
    );
    expect(() => plan('--set', 'minShare=0.4')).toThrow(/× 3 regions exceeds the budget/);
    expect(() => plan('--set', 'capacity=20')).toThrow(/minShare × capacity must be ≥ maxCost/);
    expect(() => plan('--set', 'damping=0')).toThrow(/damping/);
    // The static split does not read minShare: the same policy is fine for it.
    const p = parseCli(['--scenario', 'uniform', '--strategies', 'static', '--set', 'capacity=20']);
    if (p.help) throw new Error('help');
    expect(planRuns(p)).toHaveLength(1);
  });

  it('sweeps a protocol setting: a longer lease keeps the pre-crash shares longer', () => {
    const p = parseCli([
      '--scenario',
      'coordinator-crash',
      '--strategies',
      'dynamic',
      '--sweep',
      'leaseMs=5000,20000',
      '--set',
      'graceMs=60000',
      '--set',
      'confirmMs=2000',
    ]);
    if (p.help) throw new Error('help');
    expect(p.warnings).toEqual([]);
    const specs = planRuns(p);
    expect(specs.map((s) => s.settings.leaseMs)).toEqual([5000, 20_000]);
    const [short, long] = specs.map((s) => runSimulation(s));
    // 10 s into the crash (at 130 s) a 5 s lease has lapsed to the safe share; a 20 s lease still holds eu's.
    expect(short!.series.shares![130]![1]).toBeCloseTo(1 / 3, 9);
    expect(long!.series.shares![130]![1]).toBeGreaterThan(0.8);
    conserved(short!.result);
    conserved(long!.result);
  });

  it('is deterministic: the same seed gives the same results, another seed other ones', () => {
    const a = result('region-partition', 'dynamic', { durationS: 120, faultAtS: 40, linkLoss: 0.05 });
    const b = result('region-partition', 'dynamic', { durationS: 120, faultAtS: 40, linkLoss: 0.05 });
    const c = result('region-partition', 'dynamic', { durationS: 120, faultAtS: 40, linkLoss: 0.05 }, 3, 12);
    expect(JSON.stringify(a)).toBe(JSON.stringify(b));
    expect(JSON.stringify(a)).not.toBe(JSON.stringify(c));
  });
});
