/**
 * A region's Redis as production runs it: a master, its replicas and three sentinels (`redis-server --sentinel`),
 * each a real process on free loopback ports. Tests kill the master and watch Sentinel promote a replica.
 *
 * Always host processes, whatever the suite's backend: Sentinel hands clients the addresses servers announce,
 * and container addresses are not reachable from the host without announce settings this helper does not need.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import type { RedisServer } from '../harness/backend.js';
import { ProcessRedis, ProcessServer, processBackend } from '../harness/process-backend.js';
import { freePort, waitForPort } from '../harness/ports.js';
import { waitReplicasInSync } from '../harness/redis-replication.js';
import { tcpProxy, type TcpProxy } from './tcp-proxy.js';
import { eventually } from './wait.js';

const HOST = '127.0.0.1';

/** One sentinel: a config file it may rewrite (Sentinel insists), and `--sentinel`. */
class ProcessSentinel extends ProcessServer {
  readonly #monitor: string;

  constructor(monitor: string) {
    super('qp-sentinel-');
    this.#monitor = monitor;
  }

  protected command() {
    const file = join(this.dir, 'sentinel.conf');
    writeFileSync(file, `port ${this.port}\nbind ${HOST}\ndir ${this.dir}\n${this.#monitor}`);
    return { bin: 'redis-server', args: [file, '--sentinel'] };
  }

  protected async ready(): Promise<void> {
    await waitForPort(this.host, this.port);
  }

  async init(): Promise<this> {
    this.port = await freePort();
    await this.start();
    return this;
  }
}

export interface SentinelGroupOptions {
  /** Replicas of the master (default 1). */
  replicas?: number;
  /** Sentinel's `down-after-milliseconds`: how long the master is silent before it counts as down (default 1000). */
  downAfterMs?: number;
  /** Sentinel's `failover-timeout` (default 3000). */
  failoverTimeoutMs?: number;
  /**
   * Each replica replicates through its own TCP proxy (`links`), which a test cuts to lose the writes made
   * meanwhile: a replication lag it controls exactly. Sentinel still reaches every server directly.
   */
  replicationLinks?: boolean;
}

export interface SentinelGroup extends AsyncDisposable {
  readonly masterName: string;
  /** `host:port` of each sentinel, as `QP_REDIS_SENTINELS` takes them. */
  readonly sentinelNodes: string[];
  /** The master the group started with (tests kill it). */
  readonly master: ProcessRedis;
  readonly replicas: ProcessRedis[];
  /** With `replicationLinks`: replica i's link to the master. */
  readonly links: TcpProxy[];
  /** The port of the master the sentinels name now. */
  currentMasterPort(): Promise<number>;
}

/** Start a master, its replicas (linked and in sync) and three sentinels that know all of them and each other. */
export async function startSentinelGroup(options: SentinelGroupOptions = {}): Promise<SentinelGroup> {
  const masterName = 'qp-region';
  const started: AsyncDisposable[] = [];
  try {
    const master = await new ProcessRedis().init();
    started.push(master);
    const replicas: ProcessRedis[] = [];
    const links: TcpProxy[] = [];
    for (let i = 0; i < (options.replicas ?? 1); i++) {
      let upstream = master.port;
      if (options.replicationLinks === true) {
        const link = await tcpProxy({ host: HOST, port: master.port });
        started.push(link);
        links.push(link);
        upstream = link.port;
      }
      const replica = await new ProcessRedis(['--replicaof', HOST, String(upstream)]).init();
      started.push(replica);
      replicas.push(replica);
    }
    await waitReplicasInSync([master, ...replicas], replicas.length, 10_000);
    const monitor =
      `sentinel monitor ${masterName} ${HOST} ${master.port} 2\n` +
      `sentinel down-after-milliseconds ${masterName} ${options.downAfterMs ?? 1000}\n` +
      `sentinel failover-timeout ${masterName} ${options.failoverTimeoutMs ?? 3000}\n` +
      `sentinel parallel-syncs ${masterName} 1\n`;
    const sentinels: ProcessSentinel[] = [];
    for (let i = 0; i < 3; i++) {
      const sentinel = await new ProcessSentinel(monitor).init();
      started.push(sentinel);
      sentinels.push(sentinel);
    }
    const ask = async (port: number, ...args: string[]): Promise<unknown> => {
      const client = new Redis({ host: HOST, port, lazyConnect: true, maxRetriesPerRequest: 0 });
      client.on('error', () => undefined);
      try {
        await client.connect();
        return await client.call('SENTINEL', ...args);
      } finally {
        client.disconnect();
      }
    };
    // Sentinels find the replicas through the master and one another through hello messages (every 2 s): a
    // failover needs a quorum that knows the replica.
    await eventually(
      async () => {
        const views = await Promise.all(
          sentinels.map(async (s) => ({
            replicas: ((await ask(s.port, 'REPLICAS', masterName)) as unknown[]).length,
            others: ((await ask(s.port, 'SENTINELS', masterName)) as unknown[]).length,
          })),
        );
        return views.every((v) => v.replicas === replicas.length && v.others === 2);
      },
      15_000,
      'sentinels that know every replica and each other',
      100,
    );
    return {
      masterName,
      sentinelNodes: sentinels.map((s) => `${HOST}:${s.port}`),
      master,
      replicas,
      links,
      async currentMasterPort() {
        const reply = (await ask(sentinels[0]!.port, 'GET-MASTER-ADDR-BY-NAME', masterName)) as string[];
        return Number(reply[1]);
      },
      async [Symbol.asyncDispose]() {
        await Promise.all(started.map((s) => s[Symbol.asyncDispose]()));
      },
    };
  } catch (error) {
    await Promise.all(started.map((s) => s[Symbol.asyncDispose]()));
    throw error;
  }
}

export interface ReplicatedCluster extends AsyncDisposable {
  /** `host:port` of every node, as `QP_REDIS_CLUSTER_NODES` takes them. */
  readonly seeds: string[];
  readonly nodes: readonly RedisServer[];
  /** The node that serves `slot` as master now. */
  masterOf(slot: number): Promise<RedisServer>;
}

/**
 * A Redis Cluster as production runs it: three masters, each with one replica in sync, a node timeout of 2 s
 * after which a replica of a silent master promotes itself (processBackend.startRedisCluster).
 */
export async function startReplicatedCluster(): Promise<ReplicatedCluster> {
  const cluster = await processBackend.startRedisCluster(3, 1);
  const { nodes } = cluster;
  return {
    seeds: nodes.map((n) => `${n.host}:${n.port}`),
    nodes,
    async masterOf(slot: number) {
      for (const node of nodes) {
        const client = new Redis({ host: HOST, port: node.port, lazyConnect: true, maxRetriesPerRequest: 0 });
        client.on('error', () => undefined);
        try {
          await client.connect();
          const shards = (await client.call('CLUSTER', 'SLOTS')) as [number, number, [string, number]][];
          const owner = shards.find(([from, to]) => slot >= from && slot <= to);
          if (owner !== undefined) return nodes.find((n) => n.port === owner[2][1])!;
        } catch {
          // a dead node: ask the next
        } finally {
          client.disconnect();
        }
      }
      throw new Error(`no node serves slot ${slot}`);
    },
    [Symbol.asyncDispose]: () => cluster[Symbol.asyncDispose](),
  };
}
