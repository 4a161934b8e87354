/**
 * A script call whose connection to a cluster master drops after the master ran it (the reply lost on the way)
 * is a store failure, never sent again: ioredis's Cluster resends a command whose node connection closed
 * (`retryDelayOnFailover`), so a script the master already ran would charge (or refund) twice. As on one Redis
 * or under Sentinel (decisionRedisOptions: autoResendUnfulfilledCommands false).
 */
import type { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { bucketKey } from '../../../../core/keys.js';
import { connectRedis, whenReady } from '../../../../regional-agent/redis/connect.js';
import { RedisBucketStore } from '../../../../regional-agent/redis/bucket-store.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { replyDelayingProxy } from '../../../helpers/reply-delaying-proxy.js';
import { eventually } from '../../../helpers/wait.js';

const nodes = inject('redisCluster');
let proxies: Awaited<ReturnType<typeof replyDelayingProxy>>[];
let cluster: Cluster;

beforeAll(async () => {
  proxies = await Promise.all(nodes.map((n) => replyDelayingProxy(n)));
  const portOf = (p: (typeof proxies)[number]) => Number(new URL(p.url).port);
  cluster = connectRedis({
    redisClusterNodes: proxies.map((p) => `127.0.0.1:${portOf(p)}`),
    storeBatching: 'off',
  }) as Cluster;
  // Every node as the cluster announces it is reached through its proxy.
  cluster.options.natMap = Object.fromEntries(
    nodes.map((n, i) => [`${n.host}:${n.port}`, { host: '127.0.0.1', port: portOf(proxies[i]!) }]),
  );
  cluster.on('error', () => undefined);
  await whenReady(cluster, 10_000);
});
afterAll(async () => {
  cluster.disconnect();
  for (const p of proxies) await p[Symbol.asyncDispose]();
});

describe('a cluster master whose connection drops after it ran a script', () => {
  it('charges the script once: the call fails, it is not sent again', async () => {
    const key = bucketKey(1, uniquePrefix('lost'), 'p');
    const store = new RedisBucketStore(cluster, { batch: false, timeoutMs: 2000 });
    const check = { key, capacity: 10, refillPerSecond: 1e-7, cost: 1, ttlMs: 600_000 };
    expect((await store.decide({ checks: [check] })).results[0]!.remaining).toBe(9);
    // Whichever node owns the key's slot runs the script and loses its reply.
    for (const p of proxies) p.dropReplyAfter(key);
    const lost = await store.decide({ checks: [check] }).then(
      () => 'answered',
      () => 'failed',
    );
    for (const p of proxies) p.dropReplyAfter(undefined);
    // The call ran once, so one token of the 9 left is gone: 8 held (7 before: the call was sent again, and
    // its caller answered by the second run). The slot's node is connected again within the cluster's slot
    // refresh (1 s); until then calls fail, as after any dropped connection.
    let held: number | undefined;
    await eventually(
      async () => {
        const tk = await cluster.hget(key, 'tk').catch(() => undefined);
        held = tk === undefined || tk === null ? undefined : Number(tk) / 1e6;
        return held !== undefined;
      },
      5000,
      'the bucket read once the node is connected again',
      50,
    );
    expect(held).toBeCloseTo(8, 3);
    expect(lost).toBe('failed');
  });
});
