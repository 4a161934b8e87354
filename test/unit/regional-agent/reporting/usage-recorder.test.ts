import { describe, expect, it } from 'vitest';
import {
  MAX_CONSTRAINED_PER_POLICY,
  MAX_POLICIES_PER_USAGE,
  PolicyUsage,
} from '../../../../core/wire/protocol.js';
import { MAX_USAGE_BYTES, UsageRecorder } from '../../../../regional-agent/reporting/usage-recorder.js';

describe('usage recorder', () => {
  it('counts requested, admitted and denied cost per policy, then starts a new interval', () => {
    const u = new UsageRecorder(0);
    u.record('writes', 'a', 2, true, 0.5);
    u.record('writes', 'b', 3, false, 0);
    u.record('reads', 'a', 1, true, 0.9);
    const snap = u.take(1000);
    expect(snap.intervalMs).toBe(1000);
    expect(snap.chunks).toEqual([
      [
        {
          policy: 'writes',
          requested: 5,
          admitted: 2,
          denied: 3,
          demand: 5,
          constrained: [{ subject: 'b', requested: 3, denied: 3 }],
        },
        { policy: 'reads', requested: 1, admitted: 1, denied: 0, demand: 1, constrained: [] },
      ],
    ]);
    expect(u.take(1500)).toEqual({ intervalMs: 500, chunks: [[]], dropped: 0 });
  });

  it("counts refusals as demand only within each subject's own rate, by the policy's refill", () => {
    const u = new UsageRecorder(0, { limitPerSecond: (p) => (p === 'writes' ? 4 : undefined) });
    for (let i = 0; i < 40; i++) u.record('writes', 'noisy', 1, i === 0, 0);
    for (let i = 0; i < 40; i++) u.record('unknown-here', 'noisy', 1, i === 0, 0);
    const [writes, unknown] = u.take(500).chunks[0]!;
    expect([writes!.requested, writes!.admitted, writes!.demand]).toEqual([40, 1, 2]); // 4/s over 0.5 s
    expect(unknown!.demand).toBe(40);
  });

  it("caps a subject's demand at the rate its decision carried (its class's) before the policy's", () => {
    const u = new UsageRecorder(0, { limitPerSecond: () => 4 });
    for (let i = 0; i < 40; i++) u.record('writes', 'enterprise', 1, i === 0, 0, 40);
    for (let i = 0; i < 40; i++) u.record('writes', 'default', 1, i === 0, 0, 4);
    const [writes] = u.take(500).chunks[0]!;
    expect([writes!.requested, writes!.admitted, writes!.demand]).toEqual([80, 2, 20 + 2]);
  });

  it('reports subjects near their capacity even when admitted', () => {
    const u = new UsageRecorder(0);
    u.record('writes', 'almost-full', 1, true, 0.05);
    expect(u.take(1000).chunks[0]![0]!.constrained).toEqual([
      { subject: 'almost-full', requested: 1, denied: 0 },
    ]);
  });

  it('keeps the heaviest constrained subjects within a fixed bound, whatever the flood', () => {
    const u = new UsageRecorder(0);
    for (let i = 0; i < 10_000; i++) u.record('writes', `one-shot-${i}`, 1, false, 0);
    for (let i = 0; i < 500; i++) u.record('writes', 'hot', 1, false, 0);
    const [policy] = u.take(1000).chunks[0]!;
    expect(policy!.constrained).toHaveLength(MAX_CONSTRAINED_PER_POLICY);
    expect(policy!.constrained[0]!.subject).toBe('hot');
    expect(policy!.constrained[0]!.denied).toBeGreaterThanOrEqual(500);
    expect(PolicyUsage.safeParse(policy).success).toBe(true);
    expect(policy!.truncated).toBe(true);
  });

  it('says a constrained list is complete when it is', () => {
    const u = new UsageRecorder(0);
    for (let i = 0; i < MAX_CONSTRAINED_PER_POLICY; i++) u.record('writes', `s${i}`, 1, false, 0);
    const [policy] = u.take(1000).chunks[0]!;
    expect(policy!.constrained).toHaveLength(MAX_CONSTRAINED_PER_POLICY);
    expect(policy!.truncated).toBeUndefined();
  });

  it('splits many policies into bounded chunks and counts what it cannot carry', () => {
    const u = new UsageRecorder(0, { maxPolicies: MAX_POLICIES_PER_USAGE + 10 });
    for (let i = 0; i < MAX_POLICIES_PER_USAGE + 20; i++) u.record(`p${i}`, 's', 1, true, 1);
    const snap = u.take(1000);
    expect(snap.chunks.map((c) => c.length)).toEqual([MAX_POLICIES_PER_USAGE, 10]);
    expect(snap.dropped).toBe(10);
  });

  it('reports every watched subject of a policy, with its demand here, zero included', () => {
    const u = new UsageRecorder(0, { watched: (p) => new Set(p === 'writes' ? ['hot', 'quiet'] : []) });
    u.record('writes', 'hot', 2, true, 0.5);
    u.record('writes', 'hot', 1, false, 0);
    u.record('writes', 'other', 1, true, 0.9);
    const [policy] = u.take(1000).chunks[0]!;
    expect(policy!.watched).toEqual([
      { subject: 'hot', requested: 3, denied: 1 },
      { subject: 'quiet', requested: 0, denied: 0 },
    ]);
  });

  it('keeps every usage message under its byte bound, whatever the subjects', () => {
    const watched = new Set(Array.from({ length: 32 }, (_, i) => `h.${'w'.repeat(40)}${i}`));
    const u = new UsageRecorder(0, { watched: () => watched });
    for (let p = 0; p < 600; p++) {
      const policy = `policy-${p}`.padEnd(64, 'x');
      for (let s = 0; s < 40; s++) u.record(policy, `h.${'s'.repeat(40)}${s}`, 1, false, 0);
    }
    const snap = u.take(1000);
    expect(snap.chunks.length).toBeGreaterThan(2);
    for (const chunk of snap.chunks) {
      expect(
        JSON.stringify({
          agentId: 'agent-12345678',
          region: 'us',
          seq: 1,
          intervalMs: 1000,
          chunk: 0,
          chunks: 64,
          policies: chunk,
          dropped: 0,
        }).length,
      ).toBeLessThan(MAX_USAGE_BYTES + 1024);
    }
    expect(snap.chunks.flat()).toHaveLength(600);
  });
});
