/**
 * One hot key on the local 3-master Redis Cluster: decisions per second of a coarse global ceiling held in one
 * bucket (every decision serializes on one slot, one master's single thread) against the same ceiling split into
 * 8 sub-buckets on different slots (`shards: 8`, each C/8 and R/8; a caller picks one). Same store, same client,
 * 256 concurrent callers, alternating runs. The ceiling is large enough that every decision is an admission.
 */
import { Cluster } from 'ioredis';
import { bucketKey, shardKey } from '../core/keys.js';
import { RedisBucketStore } from '../regional-agent/redis/bucket-store.js';
import { processBackend } from '../test/harness/process-backend.js';
import { alternate, closedLoop, median, type BenchSuite } from './lib.js';

const CONCURRENCY = 256;
const SHARDS = 8;
/** 50,000/s for all tenants, a burst of one second. */
const CAPACITY = 50_000;
const REFILL = 50_000;

export const hotkeySuite: BenchSuite = {
  name: 'hotkey',
  async run({ seconds, rounds }, progress) {
    await using server = await processBackend.startRedisCluster(3);
    const cluster = new Cluster(server.nodes.map(({ host, port }) => ({ host, port })));
    try {
      // A generous wire timeout: this measures throughput, and a shared machine stalls now and then.
      const store = new RedisBucketStore(cluster, { timeoutMs: 2000 });
      const one = {
        key: bucketKey(1, 'all', 'global'),
        capacity: CAPACITY,
        refillPerSecond: REFILL,
        cost: 1,
        ttlMs: 60_000,
      };
      const shards = Array.from({ length: SHARDS }, (_, k) => ({
        key: shardKey(1, 'all', 'global', k),
        capacity: CAPACITY / SHARDS,
        refillPerSecond: REFILL / SHARDS,
        cost: 1,
        ttlMs: 60_000,
      }));
      const masters = new Set(shards.map((s) => store.slotOf(s.key)));
      const single = () => store.decide({ checks: [one] });
      const sharded = (i: number) => store.decide({ checks: [shards[i % SHARDS]!] });

      progress(`hotkey: warming up (${SHARDS} shards on ${masters.size} slots)`);
      await closedLoop(single, { concurrency: CONCURRENCY, seconds: 1 });
      await closedLoop(sharded, { concurrency: CONCURRENCY, seconds: 1 });
      const runs = await alternate(
        {
          sharded: () => closedLoop(sharded, { concurrency: CONCURRENCY, seconds }),
          single: () => closedLoop(single, { concurrency: CONCURRENCY, seconds }),
        },
        rounds,
        progress,
      );
      const s = median(runs.sharded);
      const o = median(runs.single);
      return [
        {
          bench: `hot key decisions/s on a 3-master cluster (256 callers, ${SHARDS} shards)`,
          ours: Math.round(s),
          peer: 'one unsharded key',
          peerValue: Math.round(o),
          ratio: Number((s / o).toFixed(2)),
          details: { shardedRuns: runs.sharded.map(Math.round), singleRuns: runs.single.map(Math.round) },
        },
      ];
    } finally {
      cluster.disconnect();
    }
  },
};
