/**
 * The leader's demand snapshot (core/lease/demand-snapshot.ts): what it carries, how a successor seeds from it,
 * when it is ignored, and that a successor seeded from it makes the move its predecessor was about to make.
 */
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../../../core/clock.js';
import { newPolicyState, restingUnit } from '../../../../core/lease/allocation-state.js';
import {
  DEMAND_SNAPSHOT_MAX_AGE_MS,
  DemandSnapshot,
  emptySnapshot,
  restoreDemandSnapshot,
  takeDemandSnapshot,
} from '../../../../core/lease/demand-snapshot.js';
import { LeaseCoordinator } from '../../../../core/lease/lease-coordinator.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { RebalanceSettings } from '../../../../core/rebalance/settings.js';
import { parseSnapshot } from '../../../../coordinator/protocol/demand-persistence.js';

const regions = ['us', 'eu', 'ap'];
const policy = parsePolicy({ name: 'p', capacity: 100, refillPerSecond: 100, mode: 'regional' });
const settings = RebalanceSettings.parse({});
const T0 = 1_750_000_000_000;

function state(now = T0) {
  return newPolicyState(policy, restingUnit([1 / 3, 1 / 3, 1 / 3]), settings, now);
}

describe('taking a demand snapshot', () => {
  it('carries the smoothed demand, the unmet part and the confirmation under way, compactly', () => {
    const s = state();
    s.demand.observe('0/a1234567', 80, 1000, T0, 0);
    s.demand.observe('1/b1234567', 10, 1000, T0, 1);
    s.unmet.observe('0/a1234567', 30, 1000, T0, 0);
    s.base.beyondSince = T0 - 20_000;
    s.base.lastIdeal = [0.8, 0.1, 0.1];
    const snapshot = takeDemandSnapshot(regions, s, T0 + 500);
    expect(snapshot).toEqual({
      v: 1,
      policy: 'p',
      epoch: 0,
      takenAt: T0 + 500,
      demand: { us: 80, eu: 10, ap: 0 },
      unmet: { us: 30, eu: 0, ap: 0 },
      moving: false,
      target: { us: 0.8, eu: 0.1, ap: 0.1 },
      beyondForMs: 20_500,
    });
    expect(DemandSnapshot.parse(JSON.parse(JSON.stringify(snapshot)))).toEqual(snapshot);
    expect(JSON.stringify(snapshot).length).toBeLessThan(400);
    expect(emptySnapshot(snapshot)).toBe(false);
    expect(emptySnapshot(takeDemandSnapshot(regions, state(), T0))).toBe(true);
  });
});

describe('seeding from a snapshot', () => {
  const taken = () => {
    const s = state();
    s.demand.observe('0/a1234567', 80, 1000, T0, 0);
    s.unmet.observe('0/a1234567', 30, 1000, T0, 0);
    s.base.moving = true;
    s.base.lastIdeal = [0.8, 0.1, 0.1];
    return takeDemandSnapshot(regions, s, T0);
  };

  it('restores demand at its age and the move under way when the shares are still the snapshot’s', () => {
    const s = state(T0 + 3000);
    expect(restoreDemandSnapshot(regions, s, taken(), T0 + 3000, DEMAND_SNAPSHOT_MAX_AGE_MS, 1000)).toBe(
      'restored',
    );
    // 3 s old: within two half-lives (2 s each) of silence, so not decayed yet.
    expect(s.demand.sumByTag(T0 + 3000, [0, 0, 0])).toEqual([80, 0, 0]);
    expect(s.unmet.sumByTag(T0 + 3000, [0, 0, 0])).toEqual([30, 0, 0]);
    // Decaying from the snapshot's time like any key not heard from: one half-life further, half.
    expect(s.demand.rate('0/#snapshot', T0 + 6000)).toBe(40);
    expect(s.base.moving).toBe(true);
    expect(s.base.lastIdeal).toEqual([0.8, 0.1, 0.1]);
  });

  it('places a confirmation under way on its own clock', () => {
    const s0 = state();
    s0.base.beyondSince = T0 - 45_000;
    const snapshot = takeDemandSnapshot(regions, s0, T0);
    const s = state();
    restoreDemandSnapshot(regions, s, snapshot, T0 + 10_000, DEMAND_SNAPSHOT_MAX_AGE_MS, 1000);
    expect(s.base.beyondSince).toBe(T0 - 45_000);
  });

  it('keeps the demand but not the move state when the shares moved after it', () => {
    const s = state();
    s.base.epoch = 3;
    expect(restoreDemandSnapshot(regions, s, taken(), T0, DEMAND_SNAPSHOT_MAX_AGE_MS, 1000)).toBe('restored');
    expect(s.demand.sumByTag(T0, [0, 0, 0])).toEqual([80, 0, 0]);
    expect(s.base.moving).toBe(false);
    expect(s.base.lastIdeal).toBeUndefined();
  });

  it('ignores a snapshot older than the age limit, or from the future beyond the skew', () => {
    const old = state();
    expect(restoreDemandSnapshot(regions, old, taken(), T0 + 60_001, DEMAND_SNAPSHOT_MAX_AGE_MS, 1000)).toBe(
      'stale',
    );
    expect(old.demand.size).toBe(0);
    expect(old.base.moving).toBe(false);
    const ahead = state();
    expect(restoreDemandSnapshot(regions, ahead, taken(), T0 - 1001, DEMAND_SNAPSHOT_MAX_AGE_MS, 1000)).toBe(
      'future',
    );
    expect(ahead.demand.size).toBe(0);
    expect(restoreDemandSnapshot(regions, state(), taken(), T0 - 1000, 60_000, 1000)).toBe('restored');
    const elsewhere = { ...taken(), demand: { sa: 5 }, unmet: {} };
    expect(restoreDemandSnapshot(regions, state(), elsewhere, T0, 60_000, 1000)).toBe('no_regions');
  });

  it('refuses a corrupt or oversized stored snapshot without throwing', () => {
    const good = JSON.stringify(taken());
    expect(parseSnapshot(good)).toEqual(taken());
    expect(parseSnapshot('{"v":1,')).toBeUndefined();
    expect(parseSnapshot(JSON.stringify({ ...taken(), v: 2 }))).toBeUndefined();
    expect(parseSnapshot(JSON.stringify({ ...taken(), demand: { us: -1 } }))).toBeUndefined();
    expect(parseSnapshot(JSON.stringify({ ...taken(), extra: 1 }))).toBeUndefined();
    expect(parseSnapshot(JSON.stringify({ ...taken(), target: { us: 2 } }))).toBeUndefined();
    expect(parseSnapshot(JSON.stringify({ ...taken(), policy: 'x'.repeat(5000) }))).toBeUndefined();
    // A region named like a prototype key is refused, not looked up.
    expect(parseSnapshot(good.replace('"us":80', '"__proto__":80'))).toBeUndefined();
  });
});

/** Heartbeat sequence numbers per coordinator (each agent's renewal of the previous beat was granted). */
const beats = new WeakMap<LeaseCoordinator, number>();

/** A coordinator with one agent per region, each reporting `demand` (cost per second) every second. */
function drive(c: LeaseCoordinator, clock: ManualClock, demand: readonly number[], seconds: number): void {
  for (let i = 0; i < seconds; i++) {
    clock.advance(1000);
    const seq = (beats.get(c) ?? 0) + 1;
    beats.set(c, seq);
    regions.forEach((region, r) => {
      const agentId = `${region}_agent01`;
      c.heartbeat({
        agentId,
        instance: `${region}-1`,
        region,
        seq,
        appliedRevision: 1_000_000,
        ackRevision: 1_000_000,
        mode: 'valid',
        renewedSeq: seq - 1,
      });
      c.usage({
        agentId,
        region,
        seq,
        intervalMs: 1000,
        chunk: 0,
        chunks: 1,
        dropped: 0,
        policies: [
          {
            policy: 'p',
            requested: demand[r]!,
            admitted: Math.min(demand[r]!, 30),
            denied: Math.max(0, demand[r]! - 30),
            demand: demand[r]!,
            constrained: [],
          },
        ],
      });
    });
    c.tick();
    for (const w of c.takeWrites()) if (w.record !== null) c.written(w.policy, w.seq, 1_000_000);
  }
}

describe('a successor seeded from the snapshot', () => {
  const rebalance = { roundMs: 1000, confirmMs: 30_000 };
  const lease = { leaseMs: 6000, graceMs: 12_000, skewMs: 1000, reportIntervalMs: 1000 };
  const third = 1 / 3;

  it('makes the move its predecessor was confirming, as soon as it may grow, where one without waits', () => {
    const clock = new ManualClock(T0);
    const a = new LeaseCoordinator({ coordinatorId: 'a', regions, clock, rebalance, lease });
    a.upsertPolicy(policy);
    // Past learning, then demand all in us: the move has been confirmed for 24 of its 30 s when the leader dies.
    drive(a, clock, [10, 10, 10], 10);
    drive(a, clock, [90, 0, 0], 25);
    expect(a.allocations()[0]!.shares).toEqual({ us: third, eu: third, ap: third });
    const snapshot = a.takeDemandSnapshots().find((w) => w.policy === 'p')!.snapshot!;
    expect(snapshot.beyondForMs).toBe(24_000);
    // The record as the KV holds it, and a successor that starts 3 s later from it.
    const records = [
      {
        record: {
          policy: 'p',
          version: policy.version,
          epoch: 1,
          safe: { us: third, eu: third, ap: third },
          idleTtlSeconds: policy.idleTtlSeconds,
          default: { shares: { us: third, eu: third, ap: third }, pending: {}, epoch: snapshot.epoch },
          overrides: {},
          updatedAt: T0,
        },
        revision: 7,
      },
    ];
    const successor = (demandSnapshots: DemandSnapshot[]) => {
      const at = new ManualClock(clock.now() + 3000);
      const c = new LeaseCoordinator({
        coordinatorId: 'b',
        regions,
        clock: at,
        rebalance,
        lease,
        records,
        demandSnapshots,
      });
      c.upsertPolicy(policy);
      // The first round whose shares differ from the record's, counted in seconds after the start.
      for (let s = 1; s <= 60; s++) {
        drive(c, at, [90, 0, 0], 1);
        const shares = c.allocations()[0]!.shares;
        if (Object.values(shares).some((x) => x !== third)) return { c, at: s, shares };
      }
      return { c, at: undefined, shares: undefined };
    };
    const seeded = successor([snapshot]);
    expect(seeded.c.snapshotOutcomes.get('restored')).toBe(1);
    // 24 s confirmed + 3 s of takeover + 4 s of learning ≥ 30 s (learning ends three report intervals after the
    // first heartbeat, at 1 s, every agent then holding a renewal of the successor's): the first round that may
    // move (4 s after the start) shrinks eu and ap by one step of 0.05 each and grows us by their 0.1, as the old
    // leader would have 6 s after it died.
    expect(seeded.at).toBe(4);
    const rounded = (x: Record<string, number> | undefined) =>
      Object.fromEntries(Object.entries(x ?? {}).map(([r, v]) => [r, Math.round(v * 1e9) / 1e9]));
    // (us grows into the room at once: every agent acknowledged the shrink's revision in the same round.)
    expect(rounded(seeded.shares)).toEqual({ us: 0.433333333, eu: 0.283333333, ap: 0.283333333 });
    // Without the snapshot the confirmation starts over after learning: 30 s more.
    const fresh = successor([]);
    expect(fresh.at).toBe(4 + 30);
    expect(fresh.shares).toEqual(seeded.shares);
  });
});
