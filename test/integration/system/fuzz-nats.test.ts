/**
 * Fuzzing the NATS messages the services receive, through their real adapters on a locked-down NATS (fast-check,
 * bounded runs): strict checks and loan asks an eu credential sends to the us agents, protocol messages (usage,
 * heartbeats, acks, goodbyes) it sends to the coordinator, and allocation and policy records written into the
 * buckets with a credential that may write them (a stolen coordinator nkey). Whatever arrives: a refused message
 * changes nothing in any region's Redis (every key read back, SCAN and DUMP), no store breaker opens, the shares
 * in force never sum above 1, and a bystander tenant's next decision is exactly what it would have been.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import fc from 'fast-check';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { kvNames } from '../../../core/wire/kv.js';
import { loanSubject } from '../../../core/wire/loan.js';
import { credentialTag, protocolSubjects } from '../../../core/wire/protocol.js';
import { strictSubject } from '../../../core/wire/strict.js';
import { decide, startStack, STRICT_REFUNDS, type ServiceStack } from '../../helpers/fixture/index.js';
import { redisSnapshot } from '../../helpers/redis-snapshot.js';

const RUNS = 60;

describe('fuzzing NATS messages through the agents’ and the coordinator’s adapters', () => {
  let stack: ServiceStack;
  let attacker: NatsConnection;
  let thief: NatsConnection;
  let redis: Map<string, Redis>;
  let allocations: KV;
  let policies: KV;
  const victim = { policy: 'ledger', subject: 'victim-tenant' };
  let victimRemaining: number;

  /** Every key of every region's Redis (each region has its own) with its value. */
  const snapshot = async (): Promise<string> =>
    JSON.stringify(await Promise.all([...redis.values()].map((r) => redisSnapshot(r))));

  /**
   * The bystander, in us: one token of a policy no fuzzed message names, exactly one less each time. Its policy
   * is homed in us (a whole-token capacity, no share of it), so nothing but a decision moves its count.
   */
  const victimDecides = async (): Promise<void> => {
    const r = await decide(stack.inRegion('us')[0]!.url, victim);
    expect(r.status).toBe(200);
    victimRemaining--;
    const body = r.body as unknown as { allowed: boolean; results: { remaining: number }[] };
    expect(body).toMatchObject({ allowed: true, results: [{ remaining: victimRemaining }] });
  };

  /** Nothing broke: no breaker open, and the shares of every policy in force across regions sum to at most 1. */
  const healthy = () => {
    for (const a of stack.agents) expect(a.running.agent.guard.state).toBe('closed');
    for (const policy of ['demo', 'bulk']) {
      const sum = stack.agents.reduce(
        (s, a) => s + (a.running.coordination!.holder.lease.shareFor(policy, 'x')?.share ?? 0),
        0,
      );
      expect(sum).toBeLessThanOrEqual(1 + 1e-9);
    }
  };

  const junk = fc.oneof(
    fc.string({ maxLength: 30 }),
    fc.constantFrom('', 'us', 'eu', 'mars', 'demo', 'bulk', 'refunds', 'h.abc', 'a'.repeat(200), '{x}'),
  );
  const cost = fc.oneof(
    fc.double(),
    fc.integer({ min: -2, max: 100 }),
    fc.constantFrom(0, 1e-7, 1, '1', null),
  );
  const body = (record: fc.Arbitrary<Record<string, unknown>>) =>
    fc.oneof(
      fc.anything().map((v) => JSON.stringify(v) ?? 'undefined'),
      fc.string({ maxLength: 50 }),
      record.map((r) => JSON.stringify(r)),
    );

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      secure: { tls: false },
      // Shares stay where they start: the bystander's limit does not move under it.
      rebalance: { roundMs: 60_000 },
      lease: { graceMs: 65_000 },
    });
    await stack.putPolicy('demo', { capacity: 90, refillPerSecond: 0.001, idleTtlSeconds: 1_000_000 });
    await stack.putPolicy('bulk', { capacity: 2400, refillPerSecond: 0.001, idleTtlSeconds: 2_500_000 });
    await stack.putPolicy('refunds', STRICT_REFUNDS);
    await stack.putPolicy('ledger', { ...STRICT_REFUNDS, capacity: 2400, idleTtlSeconds: 2_500_000 });
    await stack.ready(['demo', 'bulk', 'refunds', 'ledger']);
    redis = new Map([...stack.redis].map(([region, server]) => [region, new Redis(server.url)]));
    attacker = await connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions('agent-eu-2'),
      maxReconnectAttempts: 0,
    });
    thief = await connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions('coordinator'),
      maxReconnectAttempts: 0,
    });
    const names = kvNames(stack.namespace);
    allocations = await new Kvm(jetstream(thief)).open(names.allocations, { bindOnly: true });
    policies = await new Kvm(jetstream(thief)).open(names.policies, { bindOnly: true });
    const first = await decide(stack.inRegion('us')[0]!.url, victim);
    victimRemaining = (first.body as unknown as { results: { remaining: number }[] }).results[0]!.remaining;
  }, 60_000);

  afterAll(async () => {
    await attacker?.close();
    await thief?.close();
    for (const r of redis?.values() ?? []) r.disconnect();
    await stack?.[Symbol.asyncDispose]();
  });

  it('strict checks and loan asks of any shape sent to us: an answer, and a refusal changes nothing', async () => {
    const strict = strictSubject(stack.namespace, 'us').subject;
    const loan = loanSubject(stack.namespace, 'us').subject;
    const check = fc.record(
      {
        policy: fc.oneof(fc.constantFrom('refunds', 'demo'), junk),
        subject: fc.oneof(fc.constantFrom('fz-a', 'fz-b'), junk),
        cost,
      },
      { requiredKeys: [] },
    );
    const forwarded = fc.record(
      {
        fromRegion: fc.oneof(fc.constantFrom('eu', 'us'), junk),
        checks: fc.oneof(fc.array(check, { maxLength: 3 }), fc.anything()),
        dryRun: fc.oneof(fc.boolean(), fc.anything()),
        budgetMs: fc.oneof(fc.integer({ min: -1, max: 70_000 }), fc.anything()),
        idempotencyKey: junk,
      },
      { requiredKeys: [] },
    );
    const asked = fc.record(
      {
        fromRegion: fc.oneof(fc.constantFrom('eu', 'us'), junk),
        policy: fc.oneof(fc.constantFrom('demo', 'refunds'), junk),
        version: fc.oneof(fc.constantFrom(1, 2), fc.anything()),
        subject: fc.oneof(fc.constantFrom('fz-a'), junk),
        mode: fc.oneof(fc.constantFrom('fill', 'spend'), junk),
        amountMicros: fc.oneof(fc.integer({ min: -1, max: 1e9 }), fc.anything()),
      },
      { requiredKeys: [] },
    );
    // Well-formed checks of the strict policy, so the home also decides (and charges) some.
    const valid = fc.record({
      fromRegion: fc.constant('eu'),
      checks: fc.array(
        fc.record({
          policy: fc.constant('refunds'),
          subject: fc.constantFrom('fz-a', 'fz-b'),
          cost: fc.constant(1),
        }),
        { minLength: 1, maxLength: 2 },
      ),
      dryRun: fc.boolean(),
      budgetMs: fc.constant(2000),
    });
    let answered = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          valid.map((v) => ({ subject: strict, b: JSON.stringify(v) })),
          body(forwarded).map((b) => ({ subject: strict, b })),
          body(asked).map((b) => ({ subject: loan, b })),
        ),
        async ({ subject, b }) => {
          const before = await snapshot();
          const reply = await attacker.request(subject, b, { timeout: 5000 }).then(
            (m) => m.json<Record<string, unknown>>(),
            () => ({ error: 'no answer' }),
          );
          if ('error' in reply) expect(await snapshot()).toBe(before);
          else answered++;
          healthy();
          await victimDecides();
        },
      ),
      { numRuns: RUNS },
    );
    expect(answered).toBeGreaterThan(0);
  }, 120_000);

  it('usage, heartbeats, acks and goodbyes of any shape sent to the coordinator change no decision', async () => {
    // The attacker's own credential tag: the only protocol subjects the server lets it publish on.
    const tag = credentialTag(
      stack.nats.security!.bundle.credentials.find((c) => c.name === 'agent-eu-2')!.publicKey,
    );
    const subjects = protocolSubjects(stack.namespace, tag);
    const agentId = fc.oneof(
      fc.constantFrom(`${tag}_forged-agent-001`, `${tag}_ghost-agent-0001`, 'ghost-agent-0001'),
      junk,
    );
    const message = fc.record(
      {
        agentId,
        instance: junk,
        region: fc.oneof(fc.constantFrom('eu', 'us'), junk),
        seq: fc.oneof(fc.nat(), fc.anything()),
        appliedRevision: fc.oneof(fc.nat(), fc.anything()),
        ackRevision: fc.oneof(fc.nat(), fc.anything()),
        mode: fc.oneof(fc.constantFrom('none', 'valid', 'lapsed', 'settled'), junk),
        renewedSeq: fc.oneof(fc.integer({ min: -2, max: 10 }), fc.anything()),
        intervalMs: fc.oneof(fc.integer({ min: -1, max: 4_000_000 }), fc.anything()),
        chunk: fc.nat({ max: 3 }),
        chunks: fc.nat({ max: 3 }),
        policies: fc.oneof(
          fc.array(
            fc.record({
              policy: fc.constantFrom('demo', 'bulk'),
              requested: cost,
              admitted: cost,
              denied: cost,
              demand: cost,
              constrained: fc.constant([]),
            }),
            { maxLength: 2 },
          ),
          fc.anything(),
        ),
        dropped: fc.nat({ max: 2 }),
      },
      { requiredKeys: [] },
    );
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(
          subjects.usage('eu'),
          subjects.heartbeat('eu'),
          subjects.ack('eu'),
          subjects.bye('eu'),
        ),
        body(message),
        async (subject, b) => {
          const before = await snapshot();
          attacker.publish(subject, b);
          await attacker.flush();
          // The coordinator has taken it up once its own round trip through NATS is done.
          await stack.coordinator.nc.flush();
          expect(await snapshot()).toBe(before);
          healthy();
          await victimDecides();
        },
      ),
      { numRuns: RUNS },
    );
  }, 120_000);

  it('allocation and policy records of any shape written into the buckets: agents hold their budget, the coordinator restores its own', async () => {
    const share = fc.oneof(fc.double({ min: -1, max: 2 }), fc.constantFrom(0, 1, 0.5, 1 / 3, 2));
    const shares = fc.dictionary(fc.constantFrom('us', 'eu', 'ap', 'mars'), share, { maxKeys: 4 });
    const unit = fc.record({ shares, pending: shares, epoch: fc.nat() });
    const allocation = fc.record(
      {
        policy: fc.constantFrom('demo', 'bulk'),
        version: fc.constantFrom(1, 2),
        epoch: fc.nat(),
        safe: shares,
        idleTtlSeconds: fc.constantFrom(60, 1_000_000),
        default: unit,
        overrides: fc.dictionary(fc.constantFrom('victim-tenant', 'x'), unit, { maxKeys: 2 }),
        updatedAt: fc.nat(),
      },
      { requiredKeys: [] },
    );
    const policy = fc.record(
      {
        name: fc.constantFrom('demo', 'bulk'),
        capacity: fc.oneof(fc.double(), fc.constantFrom(1e6, 0, -1)),
        refillPerSecond: fc.oneof(fc.double(), fc.constantFrom(1e6, 0)),
        version: fc.constantFrom(1, 2, 3),
        mode: fc.oneof(fc.constantFrom('regional', 'strict', 'local'), junk),
        idleTtlSeconds: fc.oneof(fc.nat(), fc.anything()),
      },
      { requiredKeys: [] },
    );
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          body(allocation).map((b) => ({ kv: allocations, b })),
          body(policy).map((b) => ({ kv: policies, b })),
        ),
        fc.constantFrom('demo', 'bulk'),
        async ({ kv, b }, key) => {
          const own = (await kv.get(key))!;
          const forged = await kv.put(key, b);
          // The coordinator's guard puts its own value back under a new revision.
          await expect
            .poll(
              async () => {
                const now = (await kv.get(key))!;
                return now.revision > forged && now.string() === own.string();
              },
              { timeout: 10_000 },
            )
            .toBe(true);
          healthy();
          await victimDecides();
        },
      ),
      { numRuns: 25 },
    );
  }, 300_000);
});
