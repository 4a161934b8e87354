/**
 * The pieces the dynamic strategies measure and report with: the shares in force per allocation unit (the
 * largest share any agent of a region may decide with), and the run's share-sum accounting (the usage an agent
 * reports: test/unit/core/shares/usage-accounting.test.ts).
 */
import { describe, expect, it } from 'vitest';
import { InForceTracker, POLICY_UNIT, overrideUnit } from '../../../../simulations/dynamic/in-force.js';
import { SimKv } from '../../../../simulations/dynamic/sim-kv.js';
import { VIRTUAL_EPOCH_MS, VirtualClock } from '../../../../simulations/dynamic/virtual-clock.js';
import { Recorder } from '../../../../simulations/metrics/recorder.js';

function tracked(regionCount: number) {
  const reports: [string, number[]][] = [];
  const tracker = new InForceTracker(regionCount, (unit, shares) => reports.push([unit, [...shares]]));
  return { tracker, reports };
}

describe('shares in force', () => {
  it('takes the largest share among the agents of a region, and reports only changes', () => {
    const { tracker, reports } = tracked(2);
    const [a, b, c] = [tracker.add(0), tracker.add(0), tracker.add(1)];
    tracker.set(a, undefined, 0.5);
    tracker.set(b, undefined, 0.3);
    tracker.set(c, undefined, 0.4);
    expect(tracker.policyShares()).toEqual([0.5, 0.4]);
    // b rising to a's share changes nothing in force; a falling leaves b's.
    tracker.set(b, undefined, 0.5);
    tracker.set(a, undefined, 0.2);
    expect(reports).toEqual([
      [POLICY_UNIT, [0.5, 0]],
      [POLICY_UNIT, [0.5, 0.4]],
    ]);
    expect(tracker.policyShares()).toEqual([0.5, 0.4]);
    tracker.set(b, undefined, 0.1);
    expect(reports.at(-1)).toEqual([POLICY_UNIT, [0.2, 0.4]]);
  });

  it('counts a subject without an override at its agent’s default share, and reports a removed override once', () => {
    const { tracker, reports } = tracked(2);
    const [us, eu] = [tracker.add(0), tracker.add(1)];
    tracker.set(us, undefined, 0.5);
    tracker.set(eu, undefined, 0.5);
    // Only the us agent has applied the override so far: eu still decides s7 at its default share.
    tracker.set(us, 's7', 0.8);
    expect(reports.at(-1)).toEqual([overrideUnit('s7'), [0.8, 0.5]]);
    tracker.set(eu, 's7', 0.2);
    expect(reports.at(-1)).toEqual([overrideUnit('s7'), [0.8, 0.2]]);
    tracker.set(us, 's7', 0, true);
    tracker.set(eu, 's7', 0, true);
    expect(reports.at(-1)).toEqual([overrideUnit('s7'), []]);
    expect(reports.filter(([u, s]) => u === overrideUnit('s7') && s.length === 0)).toHaveLength(1);
  });
});

describe('share-sum accounting of a run', () => {
  it('keeps the largest sum, the time some unit spent above 1, and the largest sum in force per bin', () => {
    const r = new Recorder(10, 1, 0);
    const reports: [number, string, number[]][] = [
      [0, 'policy', [0.5, 0.5]],
      [2_000_000, 'policy', [0.7, 0.5]], // above 1 from 2 s…
      [2_500_000, 'override:s1', [0.6, 0.6]], // …a second unit above 1 overlaps…
      [3_000_000, 'policy', [0.5, 0.5]],
      [4_250_000, 'override:s1', []], // …until 4.25 s
      [9_000_000, 'policy', [0.9, 0.2]], // above 1 again until the end (10 s)
    ];
    // As the engine runs it: a sample at every bin start, reports in between.
    for (let bin = 0; bin < 10; bin++) {
      for (const [at, unit, shares] of reports) if (at === bin * 1e6) r.sharesInForce(unit, shares, at);
      r.sampleShares([0, 0], bin * 1e6);
      for (const [at, unit, shares] of reports)
        if (at > bin * 1e6 && at < (bin + 1) * 1e6) r.sharesInForce(unit, shares, at);
    }
    r.closeShares();
    expect(r.maxShareSum).toBe(1.2);
    expect(r.shareSumAboveOneUs).toBe(2_250_000 + 1_000_000);
    expect(Array.from(r.series.shareSumMax!)).toEqual([1, 1, 1.2, 1.2, 1.2, 1, 1, 1, 1, 1.1]);
  });

  it('does not count exact splits that add up to 1 in floating point as above it', () => {
    const r = new Recorder(10, 1, 0);
    r.sharesInForce('policy', [0.1, 0.2, 0.7000000000000001], 0);
    r.closeShares();
    expect(r.shareSumAboveOneUs).toBe(0);
  });
});

describe('the KV and the clock of the control plane', () => {
  it('keeps one revision sequence per bucket, with tombstones for watchers that fell behind', () => {
    const kv = new SimKv<string>();
    expect(kv.put('a', 'x')).toBe(1);
    expect(kv.put('b', 'y')).toBe(2);
    expect(kv.put('a', 'z')).toBe(3);
    expect(kv.put('b', null)).toBe(4);
    expect(kv.live()).toEqual([{ key: 'a', value: 'z', revision: 3 }]);
    expect(kv.since(2)).toEqual([
      { key: 'a', value: 'z', revision: 3 },
      { key: 'b', value: null, revision: 4 },
    ]);
    expect(kv.revision).toBe(4);
  });

  it('reads virtual µs as epoch ms and converts instants back for timers and Redis time', () => {
    let now = 0;
    const clock = new VirtualClock(() => now);
    expect(clock.now()).toBe(VIRTUAL_EPOCH_MS);
    now = 1_234_567;
    expect(clock.now()).toBeCloseTo(VIRTUAL_EPOCH_MS + 1234.567, 3);
    expect(clock.toStoreUs(clock.now())).toBe(1_234_567);
    expect(clock.toVirtualUs(VIRTUAL_EPOCH_MS + 6000)).toBe(6_000_000);
    expect(clock.toStoreUs(VIRTUAL_EPOCH_MS - 5)).toBe(0);
  });
});
