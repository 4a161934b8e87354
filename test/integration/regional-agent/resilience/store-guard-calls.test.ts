/**
 * The store breaker counts Redis calls, not decisions, on a real Redis that is paused: a burst's decisions ride
 * in one script call, and that call coming back late is one failure, not forty; a Redis that stays frozen still
 * opens the breaker after a few failed calls.
 */
import { trace } from '@opentelemetry/api';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bucketKey } from '../../../../core/keys.js';
import { AgentMetrics } from '../../../../regional-agent/observability/metrics.js';
import { RedisBucketStore, rodeAlong } from '../../../../regional-agent/redis/bucket-store.js';
import { StoreGuard, StoreUnavailableError } from '../../../../regional-agent/resilience/store-guard.js';
import type { RedisServer } from '../../../harness/backend.js';
import { backend, uniquePrefix } from '../../../harness/fixtures.js';

let server: RedisServer;
let redis: Redis;
let store: RedisBucketStore;
let guard: StoreGuard;

beforeAll(async () => {
  server = await backend().startRedis();
  redis = new Redis(server.url, { maxRetriesPerRequest: null });
  redis.on('error', () => undefined);
  // The production store timeout, 50 ms; a cold server's first script load is paid below with no deadline.
  store = new RedisBucketStore(redis, { timeoutMs: 50 });
  await new RedisBucketStore(redis, { timeoutMs: 10_000 }).decide({
    checks: [{ key: bucketKey(1, 'warm', 'p'), capacity: 1, refillPerSecond: 1, cost: 1, ttlMs: 1000 }],
    dryRun: true,
  });
  guard = newGuard();
});

function newGuard(): StoreGuard {
  return new StoreGuard(
    { errorPercent: 50, volumeThreshold: 5, resetMs: 60_000, windowMs: 60_000 },
    new AgentMetrics({ region: 'us' }),
    trace.getTracer('test'),
  );
}

afterAll(async () => {
  guard?.shutdown();
  redis?.disconnect();
  await server?.[Symbol.asyncDispose]();
});

/** `n` decisions on fresh subjects, all asked in this turn of the event loop (so they share a script call). */
function burst(n: number): Promise<unknown[]> {
  const prefix = uniquePrefix('burst');
  return Promise.all(
    Array.from({ length: n }, (_, i) =>
      guard
        .run('decide', () =>
          store.decide({
            checks: [
              {
                key: bucketKey(1, `${prefix}-${i}`, 'p'),
                capacity: 10,
                refillPerSecond: 1,
                cost: 1,
                ttlMs: 60_000,
              },
            ],
          }),
        )
        .catch((e: unknown) => e),
    ),
  );
}

describe('the store breaker on a real Redis', () => {
  it('40 decisions of one turn ride in one script call: one is told, 39 ride along', async () => {
    const answers = await burst(40);
    expect(answers.every((a) => (a as { allowed?: boolean }).allowed === true)).toBe(true);
    expect(answers.filter(rodeAlong)).toHaveLength(39);
  });

  it('that call coming back late fails its 40 decisions as one failed call: the breaker stays closed', async () => {
    await server.pause();
    try {
      const answers = await burst(40);
      expect(answers.every((a) => a instanceof StoreUnavailableError && a.kind === 'timeout')).toBe(true);
      expect(guard.status.state).toBe('closed');
    } finally {
      await server.resume();
    }
    const after = await burst(40);
    expect(after.every((a) => (a as { allowed?: boolean }).allowed === true)).toBe(true);
    expect(guard.status.state).toBe('closed');
  });

  it('a Redis that stays frozen opens it after a few failed calls, and then no decision waits for it', async () => {
    // A breaker of its own: one good call, then failed ones (4 of 5 failed at the volume threshold of 5 opens it).
    guard.shutdown();
    guard = newGuard();
    expect((await burst(1))[0]).toMatchObject({ allowed: true });
    await server.pause();
    try {
      for (let i = 0; i < 4; i++) {
        expect(guard.status.state).toBe('closed');
        const [a] = await burst(1);
        expect(a).toMatchObject({ kind: 'timeout' });
      }
      expect(guard.status.state).toBe('open');
      const started = performance.now();
      const answers = await burst(40);
      expect(answers.every((a) => a instanceof StoreUnavailableError && a.kind === 'circuit_open')).toBe(
        true,
      );
      expect(performance.now() - started).toBeLessThan(50);
    } finally {
      await server.resume();
    }
  });
});
