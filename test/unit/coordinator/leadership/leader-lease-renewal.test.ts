/**
 * The leader lease's renewals on a KV that fails as JetStream does while its streams elect (coordinator/leadership/
 * leader-lease.ts): a failed renewal is retried after 250 ms, doubling up to a third of the lease; a renewal refused
 * because an earlier one of its own landed late goes on from that revision; one refused for another holder's write
 * loses the lease at once. A fake bucket and fake timers: every instant is exact.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { LeaderRecord } from '../../../../coordinator/leadership/leader-lease.js';
import { LeaderLease, RENEW_RETRY_MS } from '../../../../coordinator/leadership/leader-lease.js';
import { silentLogger } from '../../../../coordinator/ports.js';

type Update = (value: string, revision: number) => number;

/** A one-key bucket whose updates follow `script` (then succeed as compare-and-set does). */
function fakeBucket() {
  let revision = 0;
  let value: string | undefined;
  const updates: { at: number; revision: number }[] = [];
  const script: Update[] = [];
  const entry = () =>
    value === undefined
      ? null
      : { revision, operation: 'PUT' as const, json: <T>() => JSON.parse(value!) as T };
  const kv = {
    get: () => Promise.resolve(entry()),
    create: (_key: string, v: string) => {
      value = v;
      return Promise.resolve(++revision);
    },
    update: async (_key: string, v: string, expected: number): Promise<number> => {
      await Promise.resolve();
      updates.push({ at: Date.now(), revision: expected });
      const step = script.shift();
      if (step !== undefined) return step(v, expected);
      if (expected !== revision) throw new Error(`wrong last sequence: ${revision}`);
      value = v;
      return ++revision;
    },
  };
  return {
    kv: kv as unknown as NonNullable<ConstructorParameters<typeof LeaderLease>[0]['kv']>,
    updates,
    script,
    /** Another writer's value lands (revision + 1). */
    write(v: string) {
      value = v;
      revision++;
    },
    get revision() {
      return revision;
    },
  };
}

const LEASE_MS = 3000;
const noResponders = () => {
  throw new Error("jetstream is not enabled: no responders: '$KV.x-leader.coordinator'");
};

describe('leader lease renewals', () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: 0 });
  });
  afterEach(() => vi.useRealTimers());

  const lease = (bucket: ReturnType<typeof fakeBucket>) =>
    new LeaderLease({
      nc: undefined as unknown as NatsConnection,
      bucket: 'x-leader',
      leaseMs: LEASE_MS,
      holder: 'me',
      replicas: 1,
      timeoutMs: 100,
      log: silentLogger,
      kv: bucket.kv,
      now: () => Date.now(),
    });

  it('retries a failed renewal after 250 ms, then 500 ms, and keeps leading once one lands', async () => {
    expect(RENEW_RETRY_MS).toBe(250);
    const bucket = fakeBucket();
    bucket.script.push(noResponders, noResponders);
    const l = lease(bucket);
    expect(await l.acquire()).toBe(1);
    await vi.advanceTimersByTimeAsync(2000);
    // A third of the lease, then 250 ms after the failure, then 500 ms after the second.
    expect(bucket.updates.map((u) => u.at)).toEqual([1000, 1250, 1750]);
    expect(l.isLeader()).toBe(true);
    expect(l.lost).toBeUndefined();
    // Back to a third of the lease after a success.
    await vi.advanceTimersByTimeAsync(1000);
    expect(bucket.updates.map((u) => u.at)).toEqual([1000, 1250, 1750, 2750]);
  });

  it('retries up to a third of the lease apart and loses it only once no renewal landed for a lease', async () => {
    const bucket = fakeBucket();
    for (let i = 0; i < 10; i++) bucket.script.push(noResponders);
    const reasons: string[] = [];
    const l = lease(bucket);
    l.onLost((r) => reasons.push(r));
    await l.acquire();
    await vi.advanceTimersByTimeAsync(2999);
    expect(l.isLeader()).toBe(true);
    // 1000, +250, +500, +1000 (capped at a third of the lease).
    expect(bucket.updates.map((u) => u.at)).toEqual([1000, 1250, 1750, 2750]);
    await vi.advanceTimersByTimeAsync(1);
    expect(l.isLeader()).toBe(false);
    await vi.advanceTimersByTimeAsync(1000);
    expect(reasons).toEqual(['expired']);
  });

  it('goes on from the revision of its own renewal that landed late; loses at once to another holder', async () => {
    const bucket = fakeBucket();
    const l = lease(bucket);
    await l.acquire();
    // The renewal at 1000 times out, yet its write lands: the entry names this holder and epoch at revision 2.
    bucket.script.push((v) => {
      bucket.write(v);
      throw new Error('TimeoutError: timeout');
    });
    await vi.advanceTimersByTimeAsync(1000);
    expect(bucket.revision).toBe(2);
    // The retry at 1250 is refused (it still names revision 1), reads its own entry and renews from revision 2.
    await vi.advanceTimersByTimeAsync(250);
    await vi.advanceTimersByTimeAsync(500);
    expect(bucket.updates.map((u) => [u.at, u.revision])).toEqual([
      [1000, 1],
      [1250, 1],
      [1750, 2],
    ]);
    expect(l.isLeader()).toBe(true);
    expect(l.lost).toBeUndefined();

    // Another coordinator's write: the next renewal is refused and the lease lost at once.
    const other: LeaderRecord = { holder: 'other', epoch: 2, leaseMs: LEASE_MS, at: '' };
    bucket.write(JSON.stringify(other));
    await vi.advanceTimersByTimeAsync(1000);
    expect(l.lost).toBe('superseded');
    expect(l.isLeader()).toBe(false);
  });
});
