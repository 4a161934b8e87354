/**
 * Form a Redis Cluster from empty cluster-enabled nodes, from this process with ioredis: no redis-cli needed,
 * so it works the same for local binaries and for containers (whose images need not carry redis-cli).
 */
import { Redis } from 'ioredis';
import { until } from './probes.js';

const SLOTS = 16_384;

/** Slot ranges of `masters` nodes, split as `redis-cli --cluster create` does. */
export function slotRanges(masters: number): [number, number][] {
  const per = SLOTS / masters;
  return Array.from({ length: masters }, (_, i) => [
    Math.round(i * per),
    i === masters - 1 ? SLOTS - 1 : Math.round((i + 1) * per) - 1,
  ]);
}

/**
 * Join empty cluster-enabled nodes into one cluster with no replicas: each takes a third of the slots, the
 * first meets the others, and this resolves once every node reports `cluster_state:ok`.
 */
export async function formCluster(
  nodes: readonly { host: string; port: number }[],
  timeoutMs = 20_000,
): Promise<void> {
  const clients = nodes.map(
    (n) => new Redis({ host: n.host, port: n.port, lazyConnect: true, maxRetriesPerRequest: 1 }),
  );
  try {
    await Promise.all(clients.map((c) => c.connect()));
    const ranges = slotRanges(nodes.length);
    await Promise.all(clients.map((c, i) => c.call('CLUSTER', 'ADDSLOTSRANGE', ...ranges[i]!.map(String))));
    // Different epochs let the nodes settle who owns what without a vote.
    await Promise.all(clients.map((c, i) => c.call('CLUSTER', 'SET-CONFIG-EPOCH', String(i + 1))));
    const first = clients[0]!;
    for (const n of nodes.slice(1)) await first.call('CLUSTER', 'MEET', n.host, String(n.port));
    await until(
      async () => {
        const infos = await Promise.all(clients.map((c) => c.call('CLUSTER', 'INFO') as Promise<string>));
        return infos.every(
          (info) =>
            /cluster_state:ok/.test(info) &&
            /cluster_known_nodes:(\d+)/.exec(info)?.[1] === String(nodes.length),
        );
      },
      timeoutMs,
      'the Redis Cluster never reached cluster_state:ok',
    );
  } finally {
    for (const c of clients) c.disconnect();
  }
}
