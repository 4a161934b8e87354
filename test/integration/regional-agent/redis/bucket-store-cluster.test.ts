import calculateSlot from 'cluster-key-slot';
import { afterAll, describe, expect, it } from 'vitest';
import type { BucketCheck } from '../../../../core/wire/bucket.js';
import { bucketKey, idempotencyRecordKey } from '../../../../core/keys.js';
import { CrossSlotError, RedisBucketStore } from '../../../../regional-agent/redis/bucket-store.js';
import { sharedCluster, uniquePrefix } from '../../../harness/fixtures.js';

const cluster = sharedCluster();
const store = new RedisBucketStore(cluster);
afterAll(() => cluster.disconnect());

function bucket(subject: string, policy: string, over: Partial<BucketCheck> = {}): BucketCheck {
  return {
    key: bucketKey(1, subject, policy),
    capacity: 100,
    refillPerSecond: 1e-7,
    cost: 1,
    ttlMs: 600_000,
    ...over,
  };
}

describe('RedisBucketStore on a 3-master Redis Cluster', () => {
  it('places every key of one subject in one slot, as Redis itself computes it', async () => {
    const subject = uniquePrefix();
    const keys = [bucketKey(1, subject, 'a'), bucketKey(7, subject, 'b'), idempotencyRecordKey(subject, 'x')];
    const slots = await Promise.all(keys.map((k) => cluster.cluster('KEYSLOT', k)));
    expect(new Set(slots).size).toBe(1);
    expect(slots[0]).toBe(calculateSlot(keys[0]!));
    expect(store.slotOf(keys[0]!)).toBe(slots[0]);
  });

  it('decides layered checks of one subject in one script, all-or-nothing', async () => {
    const subject = uniquePrefix();
    const tenant = bucket(subject, 'tenant', { capacity: 10 });
    const user = bucket(subject, 'user', { capacity: 1 });
    expect((await store.decide({ checks: [tenant, user] })).allowed).toBe(true);
    const denied = await store.decide({ checks: [tenant, user] });
    expect(denied.allowed).toBe(false);
    expect(denied.results.map((r) => r.remaining)).toEqual([9, 0]);
    expect((await store.decide({ checks: [tenant], dryRun: true })).results[0]!.remaining).toBe(8);
  });

  it('500 racing callers on a bucket of 100 admit exactly 100', async () => {
    const check = bucket(uniquePrefix(), 'race');
    const decisions = await Promise.all(Array.from({ length: 500 }, () => store.decide({ checks: [check] })));
    expect(decisions.filter((d) => d.allowed)).toHaveLength(100);
  });

  it('refuses a script spanning two slots with a clear error, before sending it', async () => {
    let a = uniquePrefix();
    let b = uniquePrefix();
    while (calculateSlot(bucketKey(1, a, 'p')) === calculateSlot(bucketKey(1, b, 'p'))) b = uniquePrefix();
    const call = store.decide({ checks: [bucket(a, 'p'), bucket(b, 'p')] });
    await expect(call).rejects.toBeInstanceOf(CrossSlotError);
    await expect(call).rejects.toThrow(/span cluster slots .*split the call per subject/);
    expect(await cluster.exists(bucketKey(1, a, 'p'))).toBe(0);
    a = bucketKey(1, a, 'p');
    b = bucketKey(1, b, 'p');
    // Redis itself refuses it too: the guard is not the only line of defence.
    await expect(cluster.eval("return redis.call('GET', KEYS[1])", 2, a, b)).rejects.toThrow(/CROSSSLOT/);
  });

  it('keeps deciding after SCRIPT FLUSH on every master', async () => {
    const check = bucket(uniquePrefix(), 'flush');
    expect((await store.decide({ checks: [check] })).allowed).toBe(true);
    await Promise.all(cluster.nodes('master').map((n) => n.script('FLUSH')));
    expect((await store.decide({ checks: [check] })).results[0]!.remaining).toBe(98);
  });
});
