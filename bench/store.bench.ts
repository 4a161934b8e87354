/**
 * In-process decisions per second of RedisBucketStore.decide (token bucket on Redis time) against
 * rate-limiter-flexible's RateLimiterRedis.consume (fixed window), on the same fresh Redis, same client options,
 * 256 concurrent callers over 10k subjects, alternating runs. The store coalesces the decisions that arrive in
 * one event-loop turn into one script call; the unbatched figure (one call per decision) is reported beside it.
 */
import { Redis } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { bucketKey } from '../core/keys.js';
import { RedisBucketStore } from '../regional-agent/redis/bucket-store.js';
import { processBackend } from '../test/harness/process-backend.js';
import { alternate, closedLoop, median, type BenchSuite } from './lib.js';

const SUBJECTS = 10_000;
const CONCURRENCY = 256;

export const storeSuite: BenchSuite = {
  name: 'store',
  async run({ seconds, rounds }, progress) {
    await using redisServer = await processBackend.startRedis();
    // Same options for both: one connection each, the ioredis defaults.
    const ours = new Redis({ host: redisServer.host, port: redisServer.port });
    const unbatchedClient = new Redis({ host: redisServer.host, port: redisServer.port });
    const theirs = new Redis({ host: redisServer.host, port: redisServer.port });
    try {
      const store = new RedisBucketStore(ours);
      // The same boundary with coalescing off: one script call per decision, for the record.
      const unbatched = new RedisBucketStore(unbatchedClient, { batch: false });
      // 120 per minute, burst 120: mostly admitted, like a healthy production mix.
      const keys = Array.from({ length: SUBJECTS }, (_, i) => bucketKey(1, `tenant-${i}`, 'writes'));
      const check = (i: number) => ({
        checks: [{ key: keys[i % SUBJECTS]!, capacity: 120, refillPerSecond: 2, cost: 1, ttlMs: 120_000 }],
      });
      const decide = (i: number) => store.decide(check(i));
      const decideUnbatched = (i: number) => unbatched.decide(check(i));
      const limiter = new RateLimiterRedis({
        storeClient: theirs,
        keyPrefix: 'rlf',
        points: 120,
        duration: 60,
      });
      const consume = (i: number) => limiter.consume(`tenant-${i % SUBJECTS}`);
      const acceptDenial = (e: unknown) => e instanceof RateLimiterRes;

      progress('store: warming up');
      await closedLoop(decide, { concurrency: CONCURRENCY, seconds: 1 });
      await closedLoop(consume, { concurrency: CONCURRENCY, seconds: 1, acceptError: acceptDenial });

      const runs = await alternate(
        {
          ours: () => closedLoop(decide, { concurrency: CONCURRENCY, seconds }),
          unbatched: () => closedLoop(decideUnbatched, { concurrency: CONCURRENCY, seconds }),
          peer: () => closedLoop(consume, { concurrency: CONCURRENCY, seconds, acceptError: acceptDenial }),
        },
        rounds,
        progress,
      );
      const o = median(runs.ours);
      const p = median(runs.peer);
      return [
        {
          bench: 'store decisions/s (256 callers, 10k subjects)',
          ours: Math.round(o),
          peer: 'rate-limiter-flexible',
          peerValue: Math.round(p),
          ratio: Number((o / p).toFixed(2)),
          details: {
            oursRuns: runs.ours.map(Math.round),
            peerRuns: runs.peer.map(Math.round),
            unbatched: Math.round(median(runs.unbatched)),
            unbatchedRatio: Number((median(runs.unbatched) / p).toFixed(2)),
          },
        },
      ];
    } finally {
      ours.disconnect();
      unbatchedClient.disconnect();
      theirs.disconnect();
    }
  },
};
