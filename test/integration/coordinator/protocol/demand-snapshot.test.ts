/**
 * The leader's demand snapshots on real NATS and Redis: the coordinator writes one per policy to `<ns>-demand`,
 * and a coordinator that starts after it died (no agent reporting yet) carries on from it: the same demand, and
 * the confirmation of a move that was under way, placed on its own clock. A corrupt entry beside it is counted
 * and ignored. Values are compared, not timings: the successor's snapshot is what it restored, aged by exactly
 * the time between the two.
 */
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { afterAll, describe, expect, it } from 'vitest';
import type { DemandSnapshot } from '../../../../core/lease/demand-snapshot.js';
import { kvNames } from '../../../../core/wire/kv.js';
import { parseSnapshot } from '../../../../coordinator/protocol/demand-persistence.js';
import {
  eventually,
  FAST_LEASE,
  FAST_REBALANCE,
  startProtocolStack,
  type ProtocolStack,
} from '../../../helpers/fixture/index.js';

async function stored(kv: KV, key: string): Promise<DemandSnapshot | undefined> {
  const entry = await kv.get(key);
  return entry === null || entry.operation !== 'PUT' ? undefined : parseSnapshot(entry.string());
}

async function metric(stack: ProtocolStack, outcome: string): Promise<number> {
  const text = await (await stack.admin('GET', '/metrics')).text();
  const line = text
    .split('\n')
    .find((l) => l.startsWith(`quotaplane_demand_snapshots_total{outcome="${outcome}"}`));
  return line === undefined ? 0 : Number(line.split(' ').pop());
}

describe('demand snapshots across a coordinator crash (real NATS and Redis)', () => {
  let stack: ProtocolStack | undefined;
  let nc: NatsConnection | undefined;

  afterAll(async () => {
    await nc?.close();
    await stack?.[Symbol.asyncDispose]();
  });

  it('a coordinator started after the leader died seeds its demand and its move under way from the snapshot', async () => {
    stack = await startProtocolStack({
      agentsPerRegion: 1,
      // Learning lasts a lease at most (5 s here; 1.5 s once every agent holds a renewal of the successor) and a move
      // needs its 600 s confirmation: the successor's first snapshots are taken before any move of its own.
      // Reports every 500 ms: a region stays known (reported within 3 intervals) on a busy machine, so the
      // confirmation is not reset by a late report.
      lease: { ...FAST_LEASE, leaseMs: 5000, graceMs: 12_000, reportIntervalMs: 500 },
      // A move is confirmed for ever (it stays under confirmation), and demand does not decay within the test.
      rebalance: { ...FAST_REBALANCE, confirmMs: 600_000, demandHalfLifeMs: 600_000 },
      snapshotIntervalMs: 500,
    });
    await stack.createPolicy('writes', { capacity: 30, refillPerSecond: 60, idleTtlSeconds: 2 });
    stack.setDemand('us', 80);
    nc = await connect({ servers: stack.nats.url });
    const kv = await new Kvm(jetstream(nc)).open(kvNames(stack.namespace).demand);

    // The leader's snapshot shows us's demand and a move under confirmation for a while.
    await eventually(
      async () => {
        const s = await stored(kv, 'writes');
        return s !== undefined && (s.demand['us'] ?? 0) > 0 && (s.beyondForMs ?? 0) >= 1000;
      },
      30_000,
      'a snapshot with demand in us and a confirmation under way',
      25,
    );
    // The leader dies; its agents too, so nothing reaches the successor but what the KV holds.
    await stack.killCoordinator();
    for (const agent of [...stack.agents]) await stack.stopAgent(agent, false);
    const before = (await stored(kv, 'writes'))!;
    expect(before.beyondForMs).toBeGreaterThan(0);
    expect(before.moving).toBe(false);
    // A corrupt entry beside it.
    await kv.put('junk', '{"v":1,');

    await stack.startCoordinator();
    expect(await metric(stack, 'restored')).toBe(1);
    expect(await metric(stack, 'invalid')).toBe(1);
    await eventually(
      async () => ((await stored(kv, 'writes'))?.takenAt ?? 0) > before.takenAt,
      5000,
      "the successor's own snapshot",
      25,
    );
    const after = (await stored(kv, 'writes'))!;
    // Exactly the demand it was handed (no agent has reported to it), and the same confirmation, older by the
    // time between the two snapshots.
    expect(after.demand).toEqual(before.demand);
    expect(after.unmet).toEqual(before.unmet);
    expect(after.target).toEqual(before.target);
    expect(after.beyondForMs! - before.beyondForMs!).toBe(after.takenAt - before.takenAt);
  }, 60_000);

  it('a coordinator that cannot open the snapshot bucket keeps trying, and writes snapshots once it can', async () => {
    const other = await startProtocolStack({
      agentsPerRegion: 1,
      snapshotIntervalMs: 500,
    });
    const client = await connect({ servers: other.nats.url });
    try {
      await other.createPolicy('writes', { capacity: 30, refillPerSecond: 60 });
      other.setDemand('us', 80);
      const demand = kvNames(other.namespace).demand;
      const jsm = await jetstreamManager(client);
      // The bucket is gone and a stream of another name holds its subjects: creating it fails until that goes.
      await other.killCoordinator();
      await jsm.streams.delete(`KV_${demand}`);
      await jsm.streams.add({ name: `blocker-${other.namespace}`, subjects: [`$KV.${demand}.>`] });
      await other.startCoordinator();
      expect(await metric(other, 'unavailable')).toBe(1);
      await expect(jsm.streams.info(`KV_${demand}`)).rejects.toThrow();

      await jsm.streams.delete(`blocker-${other.namespace}`);
      let kv: KV | undefined;
      await eventually(
        async () => {
          try {
            const opened = await new Kvm(jetstream(client)).open(demand, { bindOnly: true });
            if ((await stored(opened, 'writes')) !== undefined) kv = opened;
          } catch {
            // Not created yet.
          }
          return kv !== undefined;
        },
        20_000,
        'a snapshot written once the bucket could be created',
        100,
      );
      expect((await stored(kv!, 'writes'))?.demand['us']).toBeGreaterThan(0);
      // Counted once, however many attempts it took.
      expect(await metric(other, 'unavailable')).toBe(1);
    } finally {
      await client.close();
      await other[Symbol.asyncDispose]();
    }
  }, 60_000);
});
