/**
 * The second line behind NATS permissions, pure: an agent refuses allocation records that spend more than the
 * budget and renewals beyond its bounds, keeping what it had; the coordinator moves demand only on registered
 * agents' usage, bounds its roster per region and forgets agents silent for too long.
 */
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../../../core/clock.js';
import { AgentLease } from '../../../../core/lease/agent-lease.js';
import { LeaseCoordinator } from '../../../../core/lease/lease-coordinator.js';
import {
  allocationProblem,
  defaultRenewalBounds,
  renewalProblem,
  SHARE_SUM_TOLERANCE,
} from '../../../../core/lease/trust-checks.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { AllocationRecord, Heartbeat, Renewal } from '../../../../core/wire/protocol.js';
import { firstHeartbeat } from '../../../helpers/protocol-messages.js';

const renewal: Renewal = {
  coordinatorId: 'c',
  leaseMs: 6000,
  graceMs: 12_000,
  minRevision: 0,
  learning: false,
  reportIntervalMs: 1000,
};

function record(shares: Record<string, number>, extra: Partial<AllocationRecord> = {}): AllocationRecord {
  return {
    policy: 'demo',
    version: 1,
    epoch: 1,
    safe: { us: 1 / 3, eu: 1 / 3, ap: 1 / 3 },
    idleTtlSeconds: 60,
    default: { shares, pending: {}, epoch: 1 },
    overrides: {},
    updatedAt: 0,
    ...extra,
  };
}

describe('allocation records an agent refuses', () => {
  it('accepts shares that sum to 1 up to float noise, refuses any more', () => {
    expect(allocationProblem(record({ us: 0.1 + 0.2, eu: 0.7 }))).toBeUndefined(); // 1.0000000000000002
    expect(allocationProblem(record({ us: 0.5, eu: 0.5 + 2 * SHARE_SUM_TOLERANCE }))).toBe(
      'shares in force sum to 1 > 1',
    );
    expect(allocationProblem(record({ us: 1, eu: 1, ap: 1 }))).toBe('shares in force sum to 3 > 1');
  });

  it('counts a shrinking region at its pending share, and checks safe shares and overrides', () => {
    const shrinking = record({ us: 0.2, eu: 0.5, ap: 0.3 });
    shrinking.default.pending = { us: 0.4 };
    expect(allocationProblem(shrinking)).toBe('shares in force sum to 1.2 > 1');
    expect(allocationProblem(record({ us: 0.5 }, { safe: { us: 0.6, eu: 0.6 } }))).toBe(
      'safe shares sum to 1.2 > 1',
    );
    const override = record(
      { us: 0.5 },
      { overrides: { alice: { shares: { us: 0.9, eu: 0.9 }, pending: {}, epoch: 2 } } },
    );
    expect(allocationProblem(override)).toBe("an override's shares in force sum to 1.8 > 1");
  });

  it('keeps the last good record in force and its revision unapplied', () => {
    const clock = new ManualClock(1_750_000_000_000);
    const lease = new AgentLease({ region: 'us', clock, skewMs: 1000 });
    expect(lease.applyRecord('demo', record({ us: 0.3, eu: 0.3, ap: 0.4 }), 5)).toBeUndefined();
    lease.recordsLoaded();
    expect(lease.renewed(renewal, clock.now())).toBe('accepted');
    expect(lease.applyRecord('demo', record({ us: 1, eu: 1, ap: 1 }), 6)).toBe(
      'shares in force sum to 3 > 1',
    );
    expect(lease.shareFor('demo', 'anyone')?.share).toBe(0.3);
    expect(lease.appliedRevision).toBe(5);
    expect(lease.refusedRecords).toBe(1);
    // The coordinator's own record, restored at a later revision, is taken.
    expect(lease.applyRecord('demo', record({ us: 0.2, eu: 0.4, ap: 0.4 }), 7)).toBeUndefined();
    expect(lease.shareFor('demo', 'anyone')?.share).toBe(0.2);
  });
});

describe('renewals an agent refuses', () => {
  it('names the bound a reply breaks', () => {
    const b = defaultRenewalBounds;
    expect(renewalProblem(renewal, b)).toBeUndefined();
    expect(renewalProblem({ ...renewal, leaseMs: 2e9, graceMs: 3e9 }, b)).toBe(
      'lease of 2000000000 ms is longer than the 60000 ms allowed',
    );
    expect(renewalProblem({ ...renewal, graceMs: 120_001 }, b)).toBe(
      'grace of 120001 ms is longer than the 120000 ms allowed',
    );
    expect(renewalProblem({ ...renewal, graceMs: 6000 }, b)).toBe(
      'grace of 6000 ms is not longer than the lease',
    );
    expect(renewalProblem({ ...renewal, reportIntervalMs: 10 }, b)).toBe(
      'report interval of 10 ms is outside [50, 20000] ms',
    );
    expect(renewalProblem({ ...renewal, reportIntervalMs: 20_001 }, b)).toBe(
      'report interval of 20001 ms is outside [50, 20000] ms',
    );
  });

  it('a reply with leaseMs 2e9 renews nothing: the lease lapses on time through a coordinator outage', () => {
    const clock = new ManualClock(1_750_000_000_000);
    const lease = new AgentLease({ region: 'us', clock, skewMs: 1000 });
    lease.applyRecord('demo', record({ us: 0.6, eu: 0.2, ap: 0.2 }), 1);
    lease.recordsLoaded();
    expect(lease.renewed(renewal, clock.now())).toBe('accepted');
    const until = lease.leaseUntil;
    expect(lease.renewed({ ...renewal, leaseMs: 2e9, graceMs: 3e9 }, clock.now())).toBe('out_of_bounds');
    expect(lease.leaseUntil).toBe(until);
    expect(lease.refusedRenewals).toBe(1);
    clock.advance(6001);
    expect(lease.mode()).toBe('lapsed');
    expect(lease.shareFor('demo', 'x')?.share).toBeCloseTo(1 / 3, 12);
    clock.advance(12_000);
    expect(lease.mode()).toBe('settled');
  });
});

describe('what the coordinator believes', () => {
  const regions = ['us', 'eu', 'ap'];
  const policy = parsePolicy({ name: 'demo', capacity: 90, refillPerSecond: 1 });
  const heartbeat = (agentId: string, region: string, instance = agentId): Heartbeat =>
    firstHeartbeat(agentId, region, { instance });
  const usage = (agentId: string, region: string, requested: number) => ({
    agentId,
    region,
    seq: 1,
    intervalMs: 1000,
    chunk: 0,
    chunks: 1,
    policies: [{ policy: 'demo', requested, admitted: requested, denied: 0, constrained: [] }],
    dropped: 0,
  });

  function coordinator(lease: Partial<{ maxAgentsPerRegion: number; forgetAfterMs: number }> = {}) {
    const clock = new ManualClock(1_750_000_000_000);
    const engine = new LeaseCoordinator({ coordinatorId: 'c', regions, clock, lease });
    engine.upsertPolicy(policy);
    return { clock, engine };
  }

  it('drops usage from an agent id it never registered: demand does not move', () => {
    const { clock, engine } = coordinator();
    for (const r of regions) engine.heartbeat(heartbeat(`agent-${r}-00001`, r));
    const dropped = engine.counters.messagesDropped;
    for (let i = 0; i < 60; i++) {
      engine.usage(usage('agent-forged-0001', 'eu', 1000));
      for (const r of regions) engine.usage(usage(`agent-${r}-00001`, r, 10));
      clock.advance(1000);
      for (const r of regions) engine.heartbeat({ ...heartbeat(`agent-${r}-00001`, r), seq: i + 1 });
      engine.tick();
    }
    expect(engine.counters.messagesDropped - dropped).toBe(60);
    const demand = engine.allocations()[0]!.demand;
    expect(Math.round(demand['eu']!)).toBe(Math.round(demand['us']!));
  });

  it('registers at most maxAgentsPerRegion new agents per region; a known instance still replaces itself', () => {
    const { engine } = coordinator({ maxAgentsPerRegion: 3 });
    for (let i = 0; i < 3; i++)
      expect(engine.heartbeat(heartbeat(`agent-us-0000${i}`, 'us'))).toHaveProperty('leaseMs');
    expect(engine.heartbeat(heartbeat('agent-us-00009', 'us'))).toEqual({
      refused: 'region full: 3 agents registered (maxAgentsPerRegion)',
    });
    // Other regions have their own room; a restart under a known instance name takes its old slot.
    expect(engine.heartbeat(heartbeat('agent-eu-00000', 'eu'))).toHaveProperty('leaseMs');
    expect(engine.heartbeat(heartbeat('agent-us-00010', 'us', 'agent-us-00001'))).toHaveProperty('leaseMs');
    expect(
      engine
        .regionViews()[0]!
        .agents.map((a) => a.agentId)
        .sort(),
    ).toEqual(['agent-us-00000', 'agent-us-00002', 'agent-us-00010']);
  });

  it('forgets agents silent for forgetAfterMs (ten minutes by default) and frees their region', () => {
    const { clock, engine } = coordinator({ maxAgentsPerRegion: 2 });
    engine.heartbeat(heartbeat('agent-us-00001', 'us'));
    engine.heartbeat(heartbeat('agent-us-00002', 'us'));
    clock.advance(6000 + 600_000);
    engine.tick();
    expect(engine.counters.agentsForgotten).toBe(0);
    clock.advance(1);
    engine.tick();
    expect(engine.counters.agentsForgotten).toBe(2);
    expect(engine.regionViews()[0]!.agents).toEqual([]);
    expect(engine.heartbeat(heartbeat('agent-us-00003', 'us'))).toHaveProperty('leaseMs');
  });
});
