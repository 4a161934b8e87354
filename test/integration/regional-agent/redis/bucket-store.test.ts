import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InvalidBucketRequestError, type BucketCheck, type Decision } from '../../../../core/wire/bucket.js';
import { bucketKey, idempotencyIndexKey, idempotencyRecordKey } from '../../../../core/keys.js';
import { CallerDeadlineError } from '../../../../regional-agent/decisions/decision-store.js';
import {
  RedisBucketStore,
  type RedisBucketStoreOptions,
} from '../../../../regional-agent/redis/bucket-store.js';
import { agentMicros, RedisClock } from '../../../../regional-agent/redis/redis-clock.js';
import type { RedisServer } from '../../../harness/backend.js';
import { backend, sharedRedis, uniquePrefix } from '../../../harness/fixtures.js';
import { eventually } from '../../../helpers/wait.js';

const redis = sharedRedis();
const store = new RedisBucketStore(redis, { timeoutMs: 10_000 });
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
  return Array.from(
    { length: n },
    () => new RedisBucketStore(new Redis({ host: host!, port: port! }), { timeoutMs: 10_000 }),
  );
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

  it('keeps at most the set number of idempotency records per subject: 300 keys leave 100 records', async () => {
    const subject = uniquePrefix();
    const check = bucket(subject, 'idem-cap', { capacity: 1000 });
    for (let i = 0; i < 300; i++) {
      const idempotency = {
        key: idempotencyRecordKey(subject, `order-${i}`),
        ttlMs: 60_000,
        maxRecords: 100,
      };
      expect((await store.decide({ checks: [check], idempotency })).allowed).toBe(true);
    }
    const records = await redis.keys(`rl:idem:{${subject}}:*`);
    expect(records).toHaveLength(100);
    const index = idempotencyIndexKey(idempotencyRecordKey(subject, 'order-0'));
    expect(await redis.zcard(index)).toBe(100);
    expect((await redis.zrange(index, '0', '-1')).sort()).toEqual(records.sort());
    const ttl = await redis.pttl(index);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
    // The newest records are the ones kept: order-299 replays, order-0 is decided afresh.
    const newest = { key: idempotencyRecordKey(subject, 'order-299'), ttlMs: 60_000, maxRecords: 100 };
    expect((await store.decide({ checks: [check], idempotency: newest })).replayed).toBe(true);
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
    await eventually(async () => (await redis.exists(check.key)) === 0, 5000, 'the key expires');
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
    await eventually(async () => (await redis.exists(v1.key)) === 0, 5000, 'the old key expires');
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
  // One request of one bucket with a floor: G, the deadline (0: none), then n flags idem_ttl, then 7 values.
  const good = ['1', '0', '1', '2', '0', '10000000', '1', '1000000', '60000', '0', '0', '0'];
  const at = (i: number, v: string) => good.map((x, j) => (j === i ? v : x));
  const cases: [string, string[], number, RegExp][] = [
    ['request count 0', at(0, '0'), 1, /QP_BADARG request count must be >= 1/],
    ['request count 257', at(0, '257'), 1, /QP_BADARG request count must be <= 256/],
    ['request count not a number', at(0, 'x'), 1, /QP_BADARG request count is not a finite number/],
    ['negative deadline', at(1, '-1'), 1, /QP_BADARG deadline must be >= 0/],
    ['fractional deadline', at(1, '1.5'), 1, /QP_BADARG deadline must be an integer/],
    ['bucket count 0', at(2, '0'), 1, /QP_BADARG bucket count must be >= 1/],
    ['bucket count 17', at(2, '17'), 1, /QP_BADARG bucket count must be <= 16/],
    ['flags 8', at(3, '8'), 1, /QP_BADARG flags must be 0..7/],
    // Flag 4: a guard bitmask (buckets that must exist) follows the idempotency fields.
    ['guard 0', [...good.slice(0, 3), '6', '0', '0', ...good.slice(5)], 1, /QP_BADARG guard must be >= 1/],
    [
      'guard naming a bucket the request does not have',
      [...good.slice(0, 3), '6', '0', '2', ...good.slice(5)],
      1,
      /QP_BADARG guard must be < 2\^1/,
    ],
    [
      'fractional guard',
      [...good.slice(0, 3), '6', '0', '1.5', ...good.slice(5)],
      1,
      /QP_BADARG guard must be an integer/,
    ],
    ['flags negative', at(3, '-1'), 1, /QP_BADARG flags must be >= 0/],
    ['flags without floors, 7 values', at(3, '0'), 1, /QP_BADARG expected 9 arguments, got 12/],
    ['negative idempotency TTL', at(4, '-5'), 1, /QP_BADARG idempotency TTL must be >= 0/],
    [
      'missing idempotency keys',
      [...good.slice(0, 4), '500', '8', ...good.slice(5)],
      1,
      /QP_BADARG expected 3 keys, got 1/,
    ],
    [
      'zero records per subject',
      [...good.slice(0, 4), '500', '0', ...good.slice(5)],
      3,
      /QP_BADARG records per subject must be >= 1/,
    ],
    ['too few arguments', good.slice(0, 10), 1, /QP_BADARG expected 12 arguments, got 10/],
    ['too many arguments', [...good, '1'], 1, /QP_BADARG expected 12 arguments, got 13/],
    ['a second request promised but missing', at(0, '2'), 1, /QP_BADARG bucket count is not a finite number/],
    ['too many keys', good, 2, /QP_BADARG expected 1 keys, got 2/],
    ['fractional capacity', at(5, '1.5'), 1, /QP_BADARG capacity must be an integer/],
    ['negative rate', at(6, '-1'), 1, /QP_BADARG rate must be >= 0/],
    ['infinite rate', at(6, 'inf'), 1, /QP_BADARG rate is not a finite number/],
    ['nan rate', at(6, 'nan'), 1, /QP_BADARG rate is not a finite number/],
    ['zero cost', at(7, '0'), 1, /QP_BADARG cost must be >= 1/],
    ['zero ttl', at(8, '0'), 1, /QP_BADARG ttl must be >= 1/],
    ['negative floor', at(9, '-1'), 1, /QP_BADARG floor-before must be >= 0/],
    ['bad floor capacity', at(11, '0.5'), 1, /QP_BADARG floor capacity must be an integer/],
  ];
  for (const [name, argv, keyCount, message] of cases) {
    it(name, async () => {
      const key = bucketKey(1, uniquePrefix(), 'bad');
      // Seed the bucket so "changes nothing" means the stored state stays byte for byte.
      await store.decide({ checks: [bucket('x', 'y', { key })] });
      const before = await redis.hgetall(key);
      const keys = [key, bucketKey(1, 'other', 'bad'), bucketKey(1, 'third', 'bad')].slice(0, keyCount);
      await expect(redis.qpTokenBucket(keys.length, ...keys, ...argv)).rejects.toThrow(message);
      expect(await redis.hgetall(key)).toEqual(before);
    });
  }

  it('a bad second request stops the first one too: nothing is written', async () => {
    const key = bucketKey(1, uniquePrefix(), 'bad');
    await store.decide({ checks: [bucket('x', 'y', { key })] });
    const before = await redis.hgetall(key);
    const second = good.slice(2).map((v, j) => (j === 5 ? '0' : v)); // cost 0
    await expect(redis.qpTokenBucket(2, key, key, '2', '0', ...good.slice(2), ...second)).rejects.toThrow(
      /QP_BADARG cost must be >= 1/,
    );
    expect(await redis.hgetall(key)).toEqual(before);
  });
});

describe('RedisBucketStore on the wire, on a Redis of its own (frozen at will)', () => {
  let server: RedisServer;
  beforeAll(async () => {
    server = await backend().startRedis();
  });
  afterAll(async () => {
    await server[Symbol.asyncDispose]();
  });

  /** A store on its own connection, the script already loaded, its command counts reset. */
  async function connected(options: RedisBucketStoreOptions) {
    const r = new Redis({ host: server.host, port: server.port });
    const clock = new RedisClock(r);
    const s = new RedisBucketStore(r, { clock, ...options });
    await s.decide({ checks: [bucket(uniquePrefix(), 'warm')] });
    await clock.sample();
    await r.config('RESETSTAT');
    return {
      store: s,
      redis: r,
      scriptCalls: async () =>
        Number(/cmdstat_evalsha:calls=(\d+)/.exec(await r.info('commandstats'))?.[1] ?? 0),
      [Symbol.dispose]: () => {
        clock.close();
        r.disconnect();
      },
    };
  }

  /** Poll until `n` commands wait for their replies on the connection. */
  async function onTheWire(r: Redis, n: number): Promise<void> {
    await eventually(() => r.commandQueue.length >= n, 5000, `${n} commands on the wire`, 2);
    expect(r.commandQueue.length).toBe(n);
  }

  it('keeps at most callsInFlight script calls on the wire; what arrives meanwhile leaves in the next calls', async () => {
    using c = await connected({ timeoutMs: 10_000, callsInFlight: 2, maxBatch: 64 });
    const prefix = uniquePrefix('window');
    await server.pause();
    const pending: Promise<Decision>[] = [];
    try {
      // Ten event-loop turns of ten decisions each: unbounded, ten calls would queue inside Redis.
      for (let turn = 0; turn < 10; turn++) {
        for (let i = 0; i < 10; i++) {
          pending.push(c.store.decide({ checks: [bucket(`${prefix}-${turn}-${i}`, 'window')] }));
        }
        await new Promise((resolve) => setImmediate(resolve));
      }
      await onTheWire(c.redis, 2);
    } finally {
      await server.resume();
    }
    const decisions = await Promise.all(pending);
    expect(decisions.filter((d) => d.allowed)).toHaveLength(100);
    // Two calls of ten while Redis was frozen, then the eighty that waited here: one call of 64, one of 16.
    expect(await c.scriptCalls()).toBe(4);
  });

  it("a call with its caller's deadline charges nothing after it; calls without one are not held to it", async () => {
    using c = await connected({ timeoutMs: 10_000 });
    const subject = uniquePrefix('caller-deadline');
    await server.pause();
    let timed: Promise<unknown>;
    let plain: Promise<Decision>;
    // On the store's clock (agentMicros, ms here); in Redis time the deadline can only come earlier.
    const chargeBy = agentMicros() / 1000 + 100;
    try {
      timed = c.store
        .decide({ checks: [bucket(subject, 'timed')] }, { chargeBy })
        .catch((error: unknown) => error);
      plain = c.store.decide({ checks: [bucket(subject, 'plain')] });
      await onTheWire(c.redis, 2);
      // Redis stays frozen until the caller's deadline has passed.
      await eventually(() => agentMicros() / 1000 > chargeBy, 5000, "the caller's deadline passes");
    } finally {
      await server.resume();
    }
    expect(await timed).toBeInstanceOf(CallerDeadlineError);
    expect(await plain).toMatchObject({ allowed: true, results: [{ remaining: 99 }] });
    const left = await c.store.decide({ checks: [bucket(subject, 'timed')], dryRun: true });
    expect(left.results[0]!.remaining).toBe(99); // a dry run reports what is left after its cost: full
    // A deadline already passed is refused before anything is sent.
    const calls = await c.scriptCalls();
    await expect(
      c.store.decide({ checks: [bucket(subject, 'timed')] }, { chargeBy: Date.now() - 1 }),
    ).rejects.toBeInstanceOf(CallerDeadlineError);
    expect(await c.scriptCalls()).toBe(calls);
  });
});
