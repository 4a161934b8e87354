/**
 * Fuzzing the protocol messages (fast-check, bounded runs), parsed by the same schemas the NATS adapters use:
 * allocation records and heartbeat replies as an agent receives them, usage, heartbeats, acks and goodbyes as
 * the coordinator does. Whatever arrives, an agent never enforces shares that sum above 1 nor holds a lease longer
 * than its bound, and messages from no registered agent move no share.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../../../core/clock.js';
import { AgentLease } from '../../../../core/lease/agent-lease.js';
import { LeaseCoordinator } from '../../../../core/lease/lease-coordinator.js';
import { defaultRenewalBounds, SHARE_SUM_TOLERANCE } from '../../../../core/lease/trust-checks.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import {
  Ack,
  AllocationRecord,
  Bye,
  Heartbeat,
  RenewalReply,
  Usage,
} from '../../../../core/wire/protocol.js';

const regions = ['us', 'eu', 'ap'];
const share = fc.oneof(fc.double({ min: 0, max: 1, noNaN: true }), fc.constantFrom(0, 1, 0.5, 1 / 3));
const shares = fc.dictionary(fc.constantFrom(...regions, 'mars'), share, { maxKeys: 4 });
const unit = fc.record({ shares, pending: shares, epoch: fc.nat() });
/** Records that mostly pass the schema, so the checks behind it are what is exercised. */
const record = fc.oneof(
  fc.anything(),
  fc.record({
    policy: fc.constantFrom('demo', 'other'),
    version: fc.constantFrom(1, 2),
    epoch: fc.nat(),
    safe: shares,
    idleTtlSeconds: fc.constantFrom(60, 600),
    default: unit,
    overrides: fc.dictionary(fc.constantFrom('alice', 'bob'), unit, { maxKeys: 2 }),
    updatedAt: fc.nat(),
  }),
);
const renewal = fc.oneof(
  fc.anything(),
  fc.record({
    coordinatorId: fc.constantFrom('c'),
    leaseMs: fc.oneof(fc.integer({ min: 1, max: 70_000 }), fc.constant(2e9)),
    graceMs: fc.oneof(fc.integer({ min: 1, max: 130_000 }), fc.constant(3e9)),
    minRevision: fc.nat({ max: 50 }),
    learning: fc.boolean(),
    reportIntervalMs: fc.oneof(fc.integer({ min: 1, max: 30_000 }), fc.constant(1000)),
  }),
);

describe('messages an agent receives', () => {
  it('allocation records and renewals: shares in force never sum above 1, the lease never outlasts its bound', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.oneof(
            record.map((r) => ({ r })),
            renewal.map((n) => ({ n })),
          ),
          { maxLength: 30 },
        ),
        (messages) => {
          const clock = new ManualClock(1_750_000_000_000);
          const leases = regions.map((region) => new AgentLease({ region, clock, skewMs: 1000 }));
          let revision = 0;
          for (const m of messages) {
            clock.advance(100);
            if ('r' in m) {
              revision++;
              const parsed = AllocationRecord.safeParse(m.r);
              if (!parsed.success) continue;
              for (const l of leases) l.applyRecord(parsed.data.policy, parsed.data, revision);
            } else {
              const parsed = RenewalReply.safeParse(m.n);
              if (!parsed.success || 'refused' in parsed.data) continue;
              for (const l of leases) {
                l.recordsLoaded();
                l.renewed(parsed.data, clock.now());
                expect(l.leaseUntil).toBeLessThanOrEqual(clock.now() + defaultRenewalBounds.maxLeaseMs);
              }
            }
            for (const policy of ['demo', 'other']) {
              for (const subject of ['', 'alice', 'bob']) {
                let sum = 0;
                for (const l of leases) sum += l.shareFor(policy, subject)?.share ?? 0;
                expect(sum).toBeLessThanOrEqual(1 + 3 * SHARE_SUM_TOLERANCE);
              }
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe('messages the coordinator receives', () => {
  const agentId = fc.oneof(
    fc.constantFrom('agent-us-00001', 'agent-forged-01'),
    fc.string({ maxLength: 70 }),
  );
  const message = fc.record(
    {
      agentId,
      region: fc.oneof(fc.constantFrom(...regions), fc.string({ maxLength: 5 })),
      seq: fc.oneof(fc.nat(), fc.anything()),
      intervalMs: fc.oneof(fc.integer({ min: -1, max: 4_000_000 }), fc.anything()),
      chunk: fc.constantFrom(0, 1, 64),
      chunks: fc.constantFrom(1, 2, 65),
      policies: fc.array(
        fc.record({
          policy: fc.constantFrom('demo', 'x'),
          requested: fc.oneof(fc.double(), fc.double({ min: 0, max: 1e6, noNaN: true })),
          admitted: fc.double(),
          denied: fc.double(),
          constrained: fc.constant([]),
        }),
        { maxLength: 3 },
      ),
      dropped: fc.nat(),
      ackRevision: fc.nat(),
    },
    { requiredKeys: [] },
  );
  /** Well-formed usage from a forged id: what the schema lets through must still not count. */
  const forgedUsage = fc.record({
    agentId: fc.constantFrom('agent-forged-01', 'agent-us-00001'),
    region: fc.constantFrom(...regions),
    seq: fc.nat(),
    intervalMs: fc.integer({ min: 1, max: 10_000 }),
    chunk: fc.constant(0),
    chunks: fc.constant(1),
    policies: fc.array(
      fc.record({
        policy: fc.constant('demo'),
        requested: fc.double({ min: 0, max: 1e6, noNaN: true }),
        admitted: fc.constant(0),
        denied: fc.constant(0),
        constrained: fc.constant([]),
      }),
      { minLength: 1, maxLength: 2 },
    ),
    dropped: fc.constant(0),
  });

  it('usage, acks and goodbyes from no registered agent move no share and forget nobody', () => {
    fc.assert(
      fc.property(fc.array(fc.oneof(forgedUsage, message, fc.anything()), { maxLength: 40 }), (messages) => {
        const clock = new ManualClock(1_750_000_000_000);
        const engine = new LeaseCoordinator({ coordinatorId: 'c', regions, clock });
        engine.upsertPolicy(parsePolicy({ name: 'demo', capacity: 90, refillPerSecond: 1 }));
        let seq = 0;
        const beat = () => {
          for (const r of regions) {
            engine.heartbeat(
              Heartbeat.parse({
                agentId: `agent-${r}-real-1`,
                instance: r,
                region: r,
                seq,
                appliedRevision: 0,
                ackRevision: 0,
                mode: 'valid',
                renewedSeq: seq - 1,
              }),
            );
            engine.usage({
              agentId: `agent-${r}-real-1`,
              region: r,
              seq,
              intervalMs: 1000,
              chunk: 0,
              chunks: 1,
              policies: [{ policy: 'demo', requested: 10, admitted: 10, denied: 0, constrained: [] }],
              dropped: 0,
            });
          }
          seq++;
        };
        // Past learning mode, so shares could move if anything moved demand.
        for (let i = 0; i < 8; i++) {
          beat();
          clock.advance(1000);
          engine.tick();
        }
        expect(engine.learning()).toBe(false);
        const shares = JSON.stringify(engine.allocations()[0]!.shares);
        const feed = (m: unknown) => {
          const usage = Usage.safeParse(m);
          if (usage.success) engine.usage(usage.data);
          const ack = Ack.safeParse(m);
          if (ack.success) engine.ack(ack.data);
          const bye = Bye.safeParse(m);
          if (bye.success) engine.bye(bye.data);
        };
        for (let i = 0; i < 10; i++) {
          messages.forEach(feed);
          beat();
          clock.advance(1000);
          engine.tick();
        }
        // No generated id is a registered one: demand stays even, so shares stay where they were.
        expect(JSON.stringify(engine.allocations()[0]!.shares)).toBe(shares);
        expect(engine.regionViews().map((r) => r.agents.length)).toEqual([1, 1, 1]);
      }),
      { numRuns: 200 },
    );
  });
});
