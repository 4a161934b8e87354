/**
 * The contract every test backend keeps (test/harness/backend.ts), checked on whichever one runs the suite
 * (`QP_TEST_BACKEND=process` or `containers`): pause freezes a server and resume thaws it, stop and kill end it,
 * start brings it back on the same port (JetStream data kept), and a cluster serves every slot.
 */
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { connect } from '@nats-io/transport-node';
import { Cluster, Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { HARNESS_LABEL } from '../../harness/container-backend.js';
import { backend, uniquePrefix } from '../../harness/fixtures.js';
import { redisPing } from '../../../scripts/stack/probes.js';

const exec = promisify(execFile);

async function harnessContainers(): Promise<string[]> {
  const { stdout } = await exec('docker', ['ps', '-q', '--filter', `label=${HARNESS_LABEL}`]);
  return stdout.split('\n').filter((s) => s.length > 0);
}

/** Where a server runs: a container of this backend, or a process listening on its port. */
async function runsAsSelected(port: number, before: readonly string[]): Promise<void> {
  if (backend().name === 'containers') {
    const after = await harnessContainers();
    expect(after.filter((id) => !before.includes(id)).length).toBeGreaterThanOrEqual(1);
  } else {
    // A local redis-server titles itself "redis-server 127.0.0.1:<port>".
    const titles = readdirSync('/proc')
      .filter((e) => /^\d+$/.test(e))
      .map((pid) => {
        try {
          return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
        } catch {
          return '';
        }
      });
    expect(titles.some((t) => t.startsWith(`redis-server 127.0.0.1:${port}`))).toBe(true);
  }
}

describe(`server backend "${backend().name}"`, { timeout: 60_000 }, () => {
  it('Redis: pause freezes, resume thaws, kill ends, start returns on the same port with no data', async () => {
    const before = backend().name === 'containers' ? await harnessContainers() : [];
    await using redis = await backend().startRedis();
    await runsAsSelected(redis.port, before);
    const port = redis.port;
    const client = new Redis({ host: redis.host, port, lazyConnect: true, maxRetriesPerRequest: 0 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      const key = uniquePrefix('backend');
      await client.set(key, 'v');

      await redis.pause();
      expect(await redisPing(redis.host, port, 300)).toBe(false);
      await redis.resume();
      expect(await redisPing(redis.host, port, 2000)).toBe(true);
      expect(await client.get(key)).toBe('v');

      await redis.kill();
      expect(await redisPing(redis.host, port, 300)).toBe(false);
      await redis.start();
      expect(redis.port).toBe(port);
      expect(await redisPing(redis.host, port, 2000)).toBe(true);
      const fresh = new Redis({ host: redis.host, port });
      try {
        expect(await fresh.get(key)).toBeNull();
      } finally {
        fresh.disconnect();
      }

      await redis.stop();
      expect(await redisPing(redis.host, port, 300)).toBe(false);
    } finally {
      client.disconnect();
    }
  });

  it('NATS: JetStream data survives kill and start on the same port; pause stops answers', async () => {
    await using nats = await backend().startNats({ jetstream: true });
    const port = nats.port;
    const bucket = uniquePrefix('kv').toLowerCase();
    const first = await connect({ servers: nats.url });
    const kv = await new Kvm(jetstream(first)).create(bucket);
    await kv.put('k', 'kept');
    await first.close();

    await nats.pause();
    const frozen = await connect({ servers: nats.url, timeout: 500 }).then(
      async (nc) => {
        await nc.close();
        return false;
      },
      () => true,
    );
    expect(frozen).toBe(true);
    await nats.resume();

    await nats.kill();
    await nats.start();
    expect(nats.port).toBe(port);
    const second = await connect({ servers: nats.url });
    try {
      const again = await new Kvm(jetstream(second)).open(bucket);
      expect((await again.get('k'))?.string()).toBe('kept');
    } finally {
      await second.close();
    }
  });

  it('a 3-master Redis Cluster serves keys in every slot range', async () => {
    await using cluster = await backend().startRedisCluster(3);
    expect(cluster.nodes).toHaveLength(3);
    const client = new Cluster(cluster.nodes.map((n) => ({ host: n.host, port: n.port })));
    try {
      const prefix = uniquePrefix('slots');
      const keys = Array.from({ length: 30 }, (_, i) => `${prefix}:${i}`);
      for (const key of keys) await client.set(key, key);
      const owners = new Set<string>();
      for (const key of keys) {
        expect(await client.get(key)).toBe(key);
        const slot = Number(await client.call('CLUSTER', 'KEYSLOT', key));
        const node = (await client.call('CLUSTER', 'SLOTS')) as [number, number, [string, number]][];
        const owner = node.find(([lo, hi]) => slot >= lo && slot <= hi);
        owners.add(String(owner?.[2][1]));
      }
      expect(owners.size).toBe(3);
    } finally {
      client.disconnect();
    }
  });
});
