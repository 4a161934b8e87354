/**
 * Replicas of a test's Redis servers: what a server says of its replication link (`INFO replication`), a wait
 * until every replica has synced (a replica promotes itself, or is promoted, only once it has), and replicas
 * attached to a formed cluster without redis-cli (the container backend's images need not carry it).
 */
import { Redis } from 'ioredis';
import { until } from '../../scripts/stack/probes.js';

interface Node {
  readonly host: string;
  readonly port: number;
}

function connect(node: Node): Redis {
  const client = new Redis({ host: node.host, port: node.port, lazyConnect: true, maxRetriesPerRequest: 0 });
  client.on('error', () => undefined);
  return client;
}

/** A server's `INFO replication` fields (`role`, `master_link_status`, ...). */
export async function replicationInfo(node: Node): Promise<Map<string, string>> {
  const client = connect(node);
  try {
    await client.connect();
    const text = await client.info('replication');
    return new Map(
      text
        .split(/\r?\n/)
        .filter((l) => l.includes(':'))
        .map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 1)] as [string, string]),
    );
  } finally {
    client.disconnect();
  }
}

/** Resolve once exactly `replicas` of `nodes` are replicas and each one's link to its master is up. */
export async function waitReplicasInSync(
  nodes: readonly Node[],
  replicas: number,
  timeoutMs: number,
): Promise<void> {
  await until(
    async () => {
      const states = await Promise.all(nodes.map((n) => replicationInfo(n).catch(() => undefined)));
      const following = states.filter((s) => s?.get('role') === 'slave');
      return following.length === replicas && following.every((s) => s?.get('master_link_status') === 'up');
    },
    timeoutMs,
    `${replicas} replicas never all in sync with their masters`,
  );
}

/**
 * Make each of `replicas` (empty cluster-enabled nodes) a replica of a master of the formed cluster `masters`,
 * round robin (replica i follows master i mod the number of masters), as `redis-cli --cluster create
 * --cluster-replicas` does; resolves once every replica is in sync.
 */
export async function attachReplicas(
  masters: readonly Node[],
  replicas: readonly Node[],
  timeoutMs: number,
): Promise<void> {
  const masterIds = await Promise.all(
    masters.map(async (m) => {
      const client = connect(m);
      try {
        await client.connect();
        return (await client.call('CLUSTER', 'MYID')) as string;
      } finally {
        client.disconnect();
      }
    }),
  );
  await Promise.all(
    replicas.map(async (r, i) => {
      const client = connect(r);
      try {
        await client.connect();
        await client.call('CLUSTER', 'MEET', masters[0]!.host, String(masters[0]!.port));
        // REPLICATE is refused until the node has heard of its master by gossip.
        await until(
          () =>
            client.call('CLUSTER', 'REPLICATE', masterIds[i % masters.length]!).then(
              () => true,
              () => false,
            ),
          timeoutMs,
          `node ${r.port} never became a replica of ${masters[i % masters.length]!.port}`,
        );
      } finally {
        client.disconnect();
      }
    }),
  );
  await waitReplicasInSync([...masters, ...replicas], replicas.length, timeoutMs);
}
