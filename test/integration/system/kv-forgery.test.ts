/**
 * Defence in depth behind NATS permissions, on real servers: someone holding a connection that may write the
 * coordinator's buckets (here, any client of an open NATS) writes forged allocation records and policies. The
 * agents refuse a record that spends more than the budget and keep their shares; the coordinator notices every
 * entry it did not write, puts its own back, records a `restore` in the audit trail and counts it.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditResponse } from '../../../core/wire/admin.js';
import { kvNames, policyKey } from '../../../core/wire/kv.js';
import { AllocationRecord } from '../../../core/wire/protocol.js';
import { eventually, startProtocolStack, type ProtocolStack } from '../../helpers/fixture/index.js';

describe('forged KV records are refused by agents and restored by the coordinator', () => {
  let stack: ProtocolStack;
  let attacker: NatsConnection;
  let allocations: KV;
  let policies: KV;
  let names: ReturnType<typeof kvNames>;

  const audit = async () =>
    ((await (await stack.admin('GET', '/v1/audit?limit=100')).json()) as AuditResponse).entries;
  const foreign = async (bucket: string): Promise<number> => {
    const text = (await stack.coordinator.app.inject({ url: '/metrics' })).body;
    const m = new RegExp(`qp_coord_kv_foreign_writes_total\\{bucket="${bucket}"\\} (\\d+)`).exec(text);
    return m === null ? -1 : Number(m[1]);
  };
  const shareAt = (region: string) =>
    stack.agents.find((a) => a.region === region)!.holder.lease.shareFor('demo', 'anyone')?.share;

  beforeAll(async () => {
    stack = await startProtocolStack({ agentsPerRegion: 1 });
    await stack.createPolicy('demo', { capacity: 90, refillPerSecond: 1 });
    names = kvNames(stack.namespace);
    attacker = await connect({ servers: stack.nats.url, maxReconnectAttempts: 0 });
    const kvm = new Kvm(jetstream(attacker));
    allocations = await kvm.open(names.allocations, { bindOnly: true });
    policies = await kvm.open(names.policies, { bindOnly: true });
    await eventually(
      () => stack.agents.every((a) => a.holder.ready() && a.holder.lease.shareFor('demo', 'x') !== undefined),
      15_000,
      'every agent ready with a share of demo',
      25,
    );
  }, 60_000);

  afterAll(async () => {
    await attacker?.close();
    await stack?.[Symbol.asyncDispose]();
  });

  it('shares 1/1/1: every agent refuses the record and keeps its shares; the coordinator restores its own', async () => {
    const before = Object.fromEntries(stack.regions.map((r) => [r, shareAt(r)]));
    const own = AllocationRecord.parse((await allocations.get(policyKey('demo')))!.json());
    const forged: AllocationRecord = {
      ...own,
      epoch: own.epoch + 1,
      default: { ...own.default, shares: { us: 1, eu: 1, ap: 1 }, epoch: own.default.epoch + 1 },
    };
    const forgedRevision = await allocations.put(policyKey('demo'), JSON.stringify(forged));

    await eventually(
      async () => {
        const entry = await allocations.get(policyKey('demo'));
        return entry !== null && entry.revision > forgedRevision;
      },
      10_000,
      'the coordinator to restore its record',
      25,
    );
    const restored = AllocationRecord.parse((await allocations.get(policyKey('demo')))!.json());
    const sum = Object.values(restored.default.shares).reduce((a, b) => a + b, 0);
    expect(sum).toBeLessThanOrEqual(1 + 1e-9);
    // Each agent saw the forged record on its own watch, maybe after the restore: wait for each to refuse it.
    await eventually(
      () => stack.agents.every((a) => a.holder.lease.refusedRecords >= 1),
      10_000,
      'every agent to refuse the forged record',
      25,
    );
    for (const agent of stack.agents) expect(agent.holder.lease.refusedRecords).toBe(1);
    // No agent ever enforced the forged shares (the checker saw every change of the shares in force).
    stack.checker.assertHeld();
    for (const r of stack.regions) expect(shareAt(r)).toBeLessThanOrEqual((before[r] ?? 0) + 0.2);

    await eventually(
      async () => {
        const entries = await audit();
        return entries.some((e) => e.action === 'restore' && e.revision === forgedRevision);
      },
      10_000,
      'the restore in the audit trail',
      25,
    );
    const entry = (await audit()).find((e) => e.action === 'restore' && e.revision === forgedRevision)!;
    expect(entry).toMatchObject({
      actor: { role: 'system', name: 'kv-guard' },
      policy: 'demo',
      restored: { bucket: names.allocations, operation: 'put' },
    });
    expect(await foreign(names.allocations)).toBe(1);
  }, 30_000);

  it('capacity 1e6 in the policies bucket: the coordinator puts its policy back, audited and counted', async () => {
    const current = await policies.get(policyKey('demo'));
    const forgedRevision = await policies.put(
      policyKey('demo'),
      JSON.stringify({ ...current!.json<Record<string, unknown>>(), capacity: 1e6 }),
    );
    await eventually(
      async () => {
        const entry = await policies.get(policyKey('demo'));
        return (
          entry !== null &&
          entry.revision > forgedRevision &&
          entry.json<{ capacity: number }>().capacity === 90
        );
      },
      10_000,
      'the policy restored',
      25,
    );
    const served: unknown = await (await stack.admin('GET', '/v1/policies/demo')).json();
    expect(served).toMatchObject({ name: 'demo', capacity: 90 });
    await eventually(
      () => stack.agents.every((a) => a.policies.current().get('demo')?.capacity === 90),
      10_000,
      'every agent back on capacity 90',
      25,
    );
    await eventually(
      async () =>
        (await audit()).some(
          (e) =>
            e.action === 'restore' && e.revision === forgedRevision && e.restored?.bucket === names.policies,
        ),
      10_000,
      'the restore in the audit trail',
      25,
    );
    expect(await foreign(names.policies)).toBe(1);
  }, 30_000);

  it('a policy key the coordinator never wrote is deleted; GET answers 404', async () => {
    const forgedRevision = await policies.put(
      policyKey('evil'),
      JSON.stringify({ name: 'evil', capacity: 1e6, refillPerSecond: 1e6 }),
    );
    await eventually(
      async () => {
        const entry = await policies.get(policyKey('evil'));
        return entry === null || entry.operation !== 'PUT';
      },
      10_000,
      'the forged key deleted',
      25,
    );
    expect((await stack.admin('GET', '/v1/policies/evil')).status).toBe(404);
    await eventually(
      async () =>
        (await audit()).some(
          (e) =>
            e.action === 'restore' &&
            e.revision === forgedRevision &&
            e.policy === 'evil' &&
            e.restored?.operation === 'put',
        ),
      10_000,
      'the restore in the audit trail',
      25,
    );
    expect(await foreign(names.policies)).toBe(2);
    // The coordinator's own writes since (records, the restores) raised nothing.
    expect(await foreign(names.allocations)).toBe(1);
  }, 30_000);
});
