/**
 * Allocations that explain themselves, on a real coordinator with real agents on NATS and Redis: per region the
 * share, the absolute capacity and refill it gives (clean numbers), smoothed demand, admitted and refused rates,
 * lease holders; moves of the shares with their reason, as audit records of the rebalancer; a history per policy.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AllocationHistory,
  AllocationsResponse,
  AuditResponse,
  type AllocationSummary,
} from '../../../../core/wire/admin.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';
import { eventually } from '../../../helpers/wait.js';

let stack: ServiceStack;

beforeAll(async () => {
  stack = await startStack({ agentsPerRegion: 1 });
}, 60_000);
afterAll(async () => {
  await stack?.[Symbol.asyncDispose]();
});

async function allocation(policy: string): Promise<AllocationSummary | undefined> {
  const body = AllocationsResponse.parse(await (await stack.admin('GET', '/v1/allocations')).json());
  return body.policies.find((p) => p.policy === policy);
}

/** The first value `probe` finds (polled with `eventually`, every 50 ms, within `ms`). */
async function until<T>(probe: () => Promise<T | undefined>, ms: number, what: string): Promise<T> {
  let value: T | undefined;
  await eventually(async () => (value = await probe()) !== undefined, ms, what, 50);
  return value!;
}

/** At most this many decimals. */
const decimals = (n: number) => (String(n).split('.')[1] ?? '').length;

describe('GET /v1/allocations explains each allocation', () => {
  it('gives per region the share, what it gives, who holds the lease, and the first move', async () => {
    await stack.putPolicy('insight-a', { capacity: 7, refillPerSecond: 0.1 });
    await stack.ready(['insight-a']);
    const a = await until(
      async () => {
        const a = await allocation('insight-a');
        return a !== undefined &&
          Object.values(a.regions ?? {}).every((r) => r.lease.acked && r.lease.holders.length === 1)
          ? a
          : undefined;
      },
      15_000,
      'insight-a held in every region',
    );
    expect(a.budget).toEqual({ capacity: 7, refillPerSecond: 0.1 });
    for (const region of ['us', 'eu', 'ap']) {
      const r = a.regions![region]!;
      expect(r.share).toBe(a.shares[region]);
      expect(decimals(r.share)).toBeLessThanOrEqual(4);
      expect(r.capacity).toBeLessThanOrEqual(7 * r.share + 1e-9);
      expect(r.capacity).toBeGreaterThan(7 * r.share - 0.0011);
      expect(r.refillPerSecond).toBeLessThanOrEqual(0.1 * r.share + 1e-9);
      expect(decimals(r.capacity)).toBeLessThanOrEqual(3);
      expect(r.lease.holders).toEqual([expect.stringMatching(new RegExp(`^${region}-\\d+$`))]);
      expect(Date.parse(r.lease.renewedAt!)).toBeGreaterThan(Date.now() - 5_000);
    }
    // An equal three-way split of 7 tokens: 0.3333 of the budget, 2.333 tokens each.
    expect(a.regions!['us']!.share).toBe(0.3333);
    expect(a.regions!['us']!.capacity).toBe(2.333);
    const created = a.moves!.at(-1)!;
    expect(created).toMatchObject({ policy: 'insight-a', reason: 'created', from: null });
  });

  it('records a demand move as an audit event of the rebalancer, with admitted and refused rates', async () => {
    await stack.putPolicy('insight-b', { capacity: 60, refillPerSecond: 20 });
    await stack.ready(['insight-b']);
    const us = stack.inRegion('us')[0]!;
    // All the traffic in us, from three tenants each refused part of what its own rate allows: us needs room,
    // so its share grows toward it.
    let i = 0;
    const moved = await until(
      async () => {
        await Promise.all(
          Array.from({ length: 10 }, () =>
            decide(us.url, { policy: 'insight-b', subject: `t-${i++ % 3}`, cost: 1 }),
          ),
        );
        const a = await allocation('insight-b');
        // Shrinks of eu and ap go first; us grows in a later move, once they are acknowledged.
        return a?.moves?.some((m) => m.reason === 'demand' && m.to['us']! > (m.from?.['us'] ?? 1))
          ? a
          : undefined;
      },
      20_000,
      'a demand move toward us',
    );
    const move = moved.moves!.find((m) => m.reason === 'demand' && m.to['us']! > m.from!['us']!)!;
    expect(move.to['us']!).toBeGreaterThan(move.from!['us']!);
    expect(move.demand['us']!).toBeGreaterThan(0);
    expect(move.demand['eu']).toBe(0);
    // What moved it, as the rebalancer saw it: unmet demand in us, and the target the move heads for.
    expect(move.unmet!['us']!).toBeGreaterThan(0);
    expect(move.target!['us']!).toBeGreaterThan(move.target!['eu']!);
    expect(move.target!['us']!).toBeGreaterThanOrEqual(move.to['us']!);
    expect(moved.regions!['us']!.admittedPerSecond).toBeGreaterThan(0);
    expect(moved.regions!['eu']!.admittedPerSecond).toBe(0);
    expect(moved.regions!['us']!.demandPerSecond).toBeGreaterThan(0);

    const audit = AuditResponse.parse(
      await (await stack.admin('GET', '/v1/audit?policy=insight-b&limit=100')).json(),
    );
    const recorded = await until(
      async () => {
        const page = AuditResponse.parse(
          await (await stack.admin('GET', '/v1/audit?policy=insight-b&limit=100')).json(),
        );
        return page.entries.find((e) => e.action === 'move' && e.revision === move.revision);
      },
      5_000,
      'the move in the audit trail',
    );
    expect(recorded).toMatchObject({
      actor: { role: 'system', name: 'rebalancer' },
      action: 'move',
      before: null,
      after: null,
      move: {
        reason: 'demand',
        from: move.from,
        to: move.to,
        epoch: move.epoch,
        demand: move.demand,
        unmet: move.unmet,
        target: move.target,
      },
    });
    expect(audit.entries.some((e) => e.action === 'create')).toBe(true);
  });

  it('keeps a history per policy, and answers 404 for one it does not know', async () => {
    // One sample per 200 ms round: wait for a few.
    const history = await until(
      async () => {
        const h = AllocationHistory.parse(
          await (await stack.admin('GET', '/v1/allocations/history?policy=insight-b')).json(),
        );
        return h.samples.length >= 5 ? h : undefined;
      },
      5_000,
      'five samples',
    );
    const times = history.samples.map((s) => Date.parse(s.at));
    expect([...times].sort((x, y) => x - y)).toEqual(times);
    expect(history.samples.some((s) => (s.admitted['us'] ?? 0) > 0)).toBe(true);
    const missing = await stack.admin('GET', '/v1/allocations/history?policy=nope');
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as { code: string }).code).toBe('COORD_ERR_POLICY_NOT_FOUND');
    const bad = await stack.admin('GET', '/v1/allocations/history?policy=Bad!');
    expect(bad.status).toBe(400);
  });
});
