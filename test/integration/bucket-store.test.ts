import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { InvalidBucketRequestError, type BucketCheck } from '../../core/bucket-wire.js';
import { bucketKey, idempotencyRecordKey } from '../../core/keys.js';
import { RedisBucketStore } from '../../regional-agent/redis/bucket-store.js';
import { sharedRedis, uniquePrefix } from '../harness/fixtures.js';

const redis = sharedRedis();
const store = new RedisBucketStore(redis);
afterAll(() => redis.disconnect());

function bucket(subject: string, policy: string, over: Partial<BucketCheck> = {}): BucketCheck {
  // A refill so slow (0.1 micro-token a second) that racing callers see exact, time-independent numbers.
  return {
    key: bucketKey(1, subject, policy),
    capacity: 100,
    refillPerSecond: 1e-7,
    cost: 1,
    ttlMs: 200_000_000,
    ...over,
  };
}

/** Several connections, so racing callers really race inside Redis rather than queue on one socket. */
function clients(n: number): RedisBucketStore[] {
  const { host, port } = redis.options;
  return Array.from({ length: n }, () => new RedisBucketStore(new Redis({ host: host!, port: port! })));
}

describe('RedisBucketStore on a real Redis', () => {
  it('500 racing callers on a bucket of 100 admit exactly 100', async () => {
    const stores = clients(8);
    const check = bucket(uniquePrefix(), 'race');
    const decisions = await Promise.all(
      Array.from({ length: 500 }, (_, i) => stores[i % stores.length]!.decide({ checks: [check] })),
    );
    await Promise.all(stores.map((s) => s.redis.quit()));
    expect(decisions.filter((d) => d.allowed)).toHaveLength(100);
    expect(
      decisions.filter((d) => !d.allowed).every((d) => d.retryAfterMs !== null && d.retryAfterMs > 0),
    ).toBe(true);
  });

  it('racing weighted costs admit exactly what fits, as one serial chain', async () => {
    const stores = clients(8);
    const subject = uniquePrefix();
    const costs = Array.from({ length: 500 }, (_, i) => [1, 2, 3, 5, 8][(i * 7) % 5]!);
    const decisions = await Promise.all(
      costs.map((cost, i) =>
        stores[i % stores.length]!.decide({ checks: [bucket(subject, 'weighted', { cost })] }),
      ),
    );
    await Promise.all(stores.map((s) => s.redis.quit()));
    const admitted = decisions
      .map((d, i) => ({ d, cost: costs[i]! }))
      .filter(({ d }) => d.allowed)
      .sort((a, b) => b.d.results[0]!.remaining - a.d.results[0]!.remaining);
    // Every admission took its cost from exactly what the previous one left: no token minted or lost.
    let before = 100;
    for (const { d, cost } of admitted) {
      expect(d.results[0]!.remaining).toBe(before - cost);
      before = d.results[0]!.remaining;
    }
    const spent = admitted.reduce((sum, a) => sum + a.cost, 0);
    const after = await store.decide({ checks: [bucket(subject, 'weighted')], dryRun: true });
    const left = after.allowed ? after.results[0]!.remaining + 1 : after.results[0]!.remaining;
    expect(spent + left).toBe(100);
    // Each denial saw less than its cost.
    decisions.forEach((d, i) => {
      if (!d.allowed) expect(d.results[0]!.remaining).toBeLessThan(costs[i]!);
    });
  });

  it('a layered check that fails on one bucket consumes from none', async () => {
    const subject = uniquePrefix();
    const tenant = bucket(subject, 'tenant', { capacity: 10 });
    const user = bucket(subject, 'user', { capacity: 2 });
    await store.decide({ checks: [user] });
    await store.decide({ checks: [user] });
    const denied = await store.decide({ checks: [tenant, user] });
    expect(denied.allowed).toBe(false);
    expect(denied.results.map((r) => r.remaining)).toEqual([10, 0]);
    const probe = await store.decide({ checks: [tenant], dryRun: true });
    expect(probe.results[0]!.remaining).toBe(9);
  });

  it('a retry with the same idempotency key charges once, even when retries race', async () => {
    const subject = uniquePrefix();
    const check = bucket(subject, 'idem', { cost: 7 });
    const idempotency = { key: idempotencyRecordKey(subject, 'order-1'), ttlMs: 60_000 };
    const decisions = await Promise.all(
      Array.from({ length: 50 }, () => store.decide({ checks: [check], idempotency })),
    );
    expect(decisions.filter((d) => !d.replayed)).toHaveLength(1);
    expect(
      decisions.every((d) => d.allowed && d.results[0]!.remaining === decisions[0]!.results[0]!.remaining),
    ).toBe(true);
    const probe = await store.decide({ checks: [bucket(subject, 'idem')], dryRun: true });
    expect(probe.results[0]!.remaining).toBe(92);
    const ttl = await redis.pttl(idempotency.key);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
  });

  it('keeps deciding after SCRIPT FLUSH (EVALSHA falls back to EVAL)', async () => {
    const check = bucket(uniquePrefix(), 'flush');
    expect((await store.decide({ checks: [check] })).allowed).toBe(true);
    await redis.script('FLUSH');
    const after = await store.decide({ checks: [check] });
    expect(after.allowed).toBe(true);
    expect(after.results[0]!.remaining).toBe(98);
  });

  it('a bucket past its TTL behaves like a full bucket, never more', async () => {
    // capacity 1, refill 10/s: full again after 100 ms; TTL 150 ms covers that.
    const check = bucket(uniquePrefix(), 'ttl', { capacity: 1, refillPerSecond: 10, ttlMs: 150 });
    expect((await store.decide({ checks: [check] })).allowed).toBe(true);
    expect((await store.decide({ checks: [check] })).allowed).toBe(false);
    const pttl = await redis.pttl(check.key);
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(150);
    await new Promise((r) => setTimeout(r, 250));
    expect(await redis.exists(check.key)).toBe(0);
    const first = await store.decide({ checks: [check] });
    expect(first.allowed).toBe(true);
    expect(first.results[0]!.remaining).toBe(0);
    expect((await store.decide({ checks: [check] })).allowed).toBe(false);
  });

  it('a policy version bump moves decisions to new keys; the old ones expire', async () => {
    const subject = uniquePrefix();
    const v1 = { ...bucket(subject, 'export', { capacity: 1, refillPerSecond: 5, ttlMs: 300 }) };
    const v2 = { ...v1, key: bucketKey(2, subject, 'export'), ttlMs: 60_000 };
    expect((await store.decide({ checks: [v1] })).allowed).toBe(true);
    expect((await store.decide({ checks: [v1] })).allowed).toBe(false);
    const moved = await store.decide({ checks: [v2] });
    expect(moved.allowed).toBe(true);
    expect(await redis.exists(v1.key, v2.key)).toBe(2);
    await new Promise((r) => setTimeout(r, 400));
    expect(await redis.exists(v1.key)).toBe(0);
    expect(await redis.exists(v2.key)).toBe(1);
  });

  it('refuses a bad request before any I/O', async () => {
    const check = bucket(uniquePrefix(), 'bad');
    await expect(store.decide({ checks: [{ ...check, cost: -1 }] })).rejects.toBeInstanceOf(
      InvalidBucketRequestError,
    );
    expect(await redis.exists(check.key)).toBe(0);
  });
});

describe('lua/token_bucket.lua refuses every bad argument and changes nothing', () => {
  // One request of one bucket with a floor: G, then n flags idem_ttl, then 7 values.
  const good = ['1', '1', '2', '0', '10000000', '1', '1000000', '60000', '0', '0', '0'];
  const at = (i: number, v: string) => good.map((x, j) => (j === i ? v : x));
  const cases: [string, string[], number, RegExp][] = [
    ['request count 0', at(0, '0'), 1, /QP_BADARG request count must be >= 1/],
    ['request count 257', at(0, '257'), 1, /QP_BADARG request count must be <= 256/],
    ['request count not a number', at(0, 'x'), 1, /QP_BADARG request count is not a finite number/],
    ['bucket count 0', at(1, '0'), 1, /QP_BADARG bucket count must be >= 1/],
    ['bucket count 17', at(1, '17'), 1, /QP_BADARG bucket count must be <= 16/],
    ['flags 4', at(2, '4'), 1, /QP_BADARG flags must be 0..3/],
    ['flags negative', at(2, '-1'), 1, /QP_BADARG flags must be >= 0/],
    ['flags without floors, 7 values', at(2, '0'), 1, /QP_BADARG expected 8 arguments, got 11/],
    ['negative idempotency TTL', at(3, '-5'), 1, /QP_BADARG idempotency TTL must be >= 0/],
    ['missing idempotency key', at(3, '500'), 1, /QP_BADARG expected 2 keys, got 1/],
    ['too few arguments', good.slice(0, 9), 1, /QP_BADARG expected 11 arguments, got 9/],
    ['too many arguments', [...good, '1'], 1, /QP_BADARG expected 11 arguments, got 12/],
    ['a second request promised but missing', at(0, '2'), 1, /QP_BADARG bucket count is not a finite number/],
    ['too many keys', good, 2, /QP_BADARG expected 1 keys, got 2/],
    ['fractional capacity', at(4, '1.5'), 1, /QP_BADARG capacity must be an integer/],
    ['negative rate', at(5, '-1'), 1, /QP_BADARG rate must be >= 0/],
    ['infinite rate', at(5, 'inf'), 1, /QP_BADARG rate is not a finite number/],
    ['nan rate', at(5, 'nan'), 1, /QP_BADARG rate is not a finite number/],
    ['zero cost', at(6, '0'), 1, /QP_BADARG cost must be >= 1/],
    ['zero ttl', at(7, '0'), 1, /QP_BADARG ttl must be >= 1/],
    ['negative floor', at(8, '-1'), 1, /QP_BADARG floor-before must be >= 0/],
    ['bad floor capacity', at(10, '0.5'), 1, /QP_BADARG floor capacity must be an integer/],
  ];
  for (const [name, argv, keyCount, message] of cases) {
    it(name, async () => {
      const key = bucketKey(1, uniquePrefix(), 'bad');
      // Seed the bucket so "changes nothing" means the stored state stays byte for byte.
      await store.decide({ checks: [bucket('x', 'y', { key })] });
      const before = await redis.hgetall(key);
      const keys = [key, bucketKey(1, 'other', 'bad')].slice(0, keyCount);
      await expect(redis.qpTokenBucket(keys.length, ...keys, ...argv)).rejects.toThrow(message);
      expect(await redis.hgetall(key)).toEqual(before);
    });
  }

  it('a bad second request stops the first one too: nothing is written', async () => {
    const key = bucketKey(1, uniquePrefix(), 'bad');
    await store.decide({ checks: [bucket('x', 'y', { key })] });
    const before = await redis.hgetall(key);
    const second = good.slice(1).map((v, j) => (j === 5 ? '0' : v)); // cost 0
    await expect(redis.qpTokenBucket(2, key, key, '2', ...good.slice(1), ...second)).rejects.toThrow(
      /QP_BADARG cost must be >= 1/,
    );
    expect(await redis.hgetall(key)).toEqual(before);
  });
});
