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
  /** `auto`: ioredis auto-pipelining (commands of one event-loop turn leave in one write). */
  storeBatching?: 'batch' | 'auto' | 'off' | undefined;
}

/** A client for one Redis or one Redis Cluster, with the decision path's options. */
export function connectRedis(target: RedisTarget): Redis | Cluster {
  const enableAutoPipelining = target.storeBatching === 'auto';
  if (target.redisClusterNodes !== undefined) {
    const nodes = target.redisClusterNodes.map((n) => {
      const at = n.lastIndexOf(':');
      return { host: n.slice(0, at).replace(/^\[|\]$/g, ''), port: Number(n.slice(at + 1)) };
    });
    const { enableOfflineQueue: _offline, retryStrategy: _retry, ...perNode } = decisionRedisOptions;
    const options = {
      enableOfflineQueue: false,
      enableReadyCheck: true,
      enableAutoPipelining,
      clusterRetryStrategy: (times: number) => Math.min(100 * times, 2000),
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
