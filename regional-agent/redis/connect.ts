import { isIP, type Socket } from 'node:net';
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';

/**
 * Client options for the decision path. A command never waits for a connection (offline queue off: it fails
 * at once and the policy's failure mode applies), and a command whose connection dropped is not sent again on
 * reconnect, because a replayed script could charge a bucket twice.
 */
export const decisionRedisOptions = {
  enableOfflineQueue: false,
  autoResendUnfulfilledCommands: false,
  maxRetriesPerRequest: 0,
  // Reconnect quickly, forever: the circuit breaker, not the client, decides when to try Redis again.
  retryStrategy: (times: number) => Math.min(50 * times, 1000),
  connectTimeout: 2000,
  lazyConnect: false,
} satisfies RedisOptions;

export interface RedisTarget {
  redisUrl?: string | undefined;
  redisClusterNodes?: readonly string[] | undefined;
  /** Sentinels, `host:port` each, watching the master named `redisMasterName`. */
  redisSentinels?: readonly string[] | undefined;
  redisMasterName?: string | undefined;
  /** `auto`: ioredis auto-pipelining (commands of one event-loop turn leave in one write). */
  storeBatching?: 'batch' | 'auto' | 'off' | undefined;
}

/** `host:port` or `[v6]:port` as ioredis takes a node. */
function hostPort(node: string): { host: string; port: number } {
  const at = node.lastIndexOf(':');
  return { host: node.slice(0, at).replace(/^\[|\]$/g, ''), port: Number(node.slice(at + 1)) };
}

/**
 * A client for one Redis, one Redis Cluster or a Redis under Sentinel, with the decision path's options.
 *
 * Under Sentinel the client asks the sentinels for the master at every (re)connection; a dead master drops the
 * connection and a demoted one answers READONLY, so a failover costs the time Sentinel takes to promote plus one
 * reconnection. A master frozen or cut off does neither (followPromotions covers it). A command in flight when the
 * master died fails (it is never resent: see decisionRedisOptions); the new master's empty script cache is refilled
 * by ioredis, which answers NOSCRIPT with EVAL (defineScript).
 */
export function connectRedis(target: RedisTarget): Redis | Cluster {
  const enableAutoPipelining = target.storeBatching === 'auto';
  if (target.redisSentinels !== undefined) {
    if (target.redisMasterName === undefined) throw new Error('a Sentinel target needs its master name');
    const client = new Redis({
      ...decisionRedisOptions,
      enableAutoPipelining,
      sentinels: target.redisSentinels.map(hostPort),
      name: target.redisMasterName,
      role: 'master',
      // Not ioredis's failoverDetector: its disconnect on +switch-master can land while the client is asking a
      // sentinel for the new master, and ioredis then ends the client for good (seen in
      // test/integration/regional-agent/redis/redis-sentinel.test.ts: status `end`, no decision for 30 s after a promotion). A killed
      // master drops the connection by itself; a demoted one answers writes READONLY, which reconnects
      // (the command was refused, so nothing ran and nothing is resent).
      reconnectOnError: (error: Error) => error.message.startsWith('READONLY'),
      // Ask the sentinels again quickly: until one answers, every decision takes its policy's failure mode.
      sentinelRetryStrategy: (times: number) => Math.min(50 * times, 1000),
    });
    followPromotions(client, target.redisSentinels.map(hostPort), target.redisMasterName);
    return client;
  }
  if (target.redisClusterNodes !== undefined) {
    const nodes = target.redisClusterNodes.map(hostPort);
    const { enableOfflineQueue: _offline, retryStrategy: _retry, ...perNode } = decisionRedisOptions;
    const options = {
      enableOfflineQueue: false,
      enableReadyCheck: true,
      enableAutoPipelining,
      clusterRetryStrategy: (times: number) => Math.min(100 * times, 2000),
      // A command whose node connection closed is failed, not sent again: ioredis's Cluster otherwise resends it
      // (after this delay) whatever the node did with it, and a script the master ran before its connection
      // dropped charged twice, a refund refunded twice (found by review). MOVED, ASK, TRYAGAIN and CLUSTERDOWN,
      // which Redis answers only for a command it did not run, are still followed.
      retryDelayOnFailover: 0,
      // Without it ioredis learns a new slot map only from MOVED, which a dead master never sends: a command for
      // its slots fails until restart, though a replica was promoted seconds ago. Refreshing every second, the
      // agent finds the promoted replica within a second of the promotion.
      slotsRefreshInterval: 1000,
      redisOptions: perNode,
    } satisfies ClusterOptions;
    return new Cluster(nodes, options);
  }
  if (target.redisUrl === undefined) throw new Error('no Redis configured');
  return new Redis(target.redisUrl, { ...decisionRedisOptions, enableAutoPipelining });
}

/**
 * Resolve once the client is ready, or after `timeoutMs` anyway: an agent may start while Redis is down (its
 * policies' failure modes apply meanwhile), it just should not send its first decisions into a handshake.
 */
export function whenReady(redis: Redis | Cluster, timeoutMs: number): Promise<boolean> {
  if (redis.status === 'ready') return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      redis.off('ready', onReady);
      resolve(false);
    }, timeoutMs);
    const onReady = () => {
      clearTimeout(timer);
      resolve(true);
    };
    redis.once('ready', onReady);
  });
}

/** How often the sentinels are asked which master they name, ms. */
export const MASTER_CHECK_MS = 1000;

/**
 * Follow a promotion the client's own connection does not show. A master that is frozen or cut off from the
 * sentinels keeps the client's socket open and answers nothing (each decision times out into its failure mode),
 * and once it comes back it decides again, on the tokens it held, until Sentinel demotes it, about ten seconds
 * later: found by review, 386 admitted of a bucket of 300 without WAIT, and every decision failed until the
 * demotion with it. So every MASTER_CHECK_MS one sentinel (the next one when it does not answer) is asked which
 * master it names; when two answers in a row name another address than the one the client is connected to, its
 * socket is destroyed and the client reconnects, asking the sentinels for the master. Only while the client is
 * ready (a reconnection under way asks the sentinels anyway: a disconnect then is what made ioredis's own failover
 * detector end the client), and only when the sentinel names an IP address (a hostname cannot be compared with the
 * socket's address). Stops when the client ends.
 */
function followPromotions(client: Redis, sentinels: { host: string; port: number }[], name: string): void {
  const links: (Redis | undefined)[] = [];
  let next = 0;
  let mismatches = 0;
  let asking = false;
  const link = (i: number): Redis => {
    let s = links[i];
    if (s === undefined) {
      s = new Redis({
        ...sentinels[i]!,
        maxRetriesPerRequest: 0,
        connectTimeout: MASTER_CHECK_MS / 2,
        commandTimeout: MASTER_CHECK_MS / 2,
        retryStrategy: (times: number) => Math.min(100 * times, 2000),
      });
      s.on('error', () => undefined);
      links[i] = s;
    }
    return s;
  };
  const named = async (): Promise<string | undefined> => {
    for (let tried = 0; tried < sentinels.length; tried++) {
      const i = next;
      try {
        const reply = await link(i).call('SENTINEL', 'get-master-addr-by-name', name);
        if (Array.isArray(reply) && typeof reply[0] === 'string' && typeof reply[1] === 'string')
          return `${reply[0]}:${reply[1]}`;
        return undefined;
      } catch {
        next = (i + 1) % sentinels.length;
      }
    }
    return undefined;
  };
  const check = async (): Promise<void> => {
    if (asking || client.status !== 'ready') return;
    asking = true;
    try {
      const master = await named();
      const socket = client.stream as Socket | undefined;
      const address = socket?.remoteAddress?.replace(/^::ffff:/, '');
      const connected = address === undefined ? undefined : `${address}:${String(socket?.remotePort)}`;
      const host = master?.slice(0, master.lastIndexOf(':'));
      if (master === undefined || connected === undefined || host === undefined || isIP(host) === 0) {
        mismatches = 0;
        return;
      }
      mismatches = master === connected ? 0 : mismatches + 1;
      if (mismatches >= 2 && client.status === 'ready' && socket === client.stream) {
        mismatches = 0;
        // Destroyed, not ended: a frozen master never closes its side, and ioredis's disconnect waits 2 s for
        // that. The client reconnects as after any dropped connection (retryStrategy), asking the sentinels.
        socket?.destroy();
      }
    } finally {
      asking = false;
    }
  };
  const timer = setInterval(() => void check(), MASTER_CHECK_MS);
  timer.unref();
  client.once('end', () => {
    clearInterval(timer);
    for (const s of links) s?.disconnect();
  });
}
