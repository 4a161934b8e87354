import { randomUUID } from 'node:crypto';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { inject } from 'vitest';
import type { ServerBackend } from './backend.js';
import { selectBackend } from './select-backend.js';

/** A key prefix no other test uses: tests never flush, they own their keys. */
export function uniquePrefix(label = 't'): string {
  return `${label}-${randomUUID().slice(0, 8)}`;
}

/**
 * Four hex digits no other test uses as an IPv6 group, with no leading zero: the agent keys an address by its
 * canonical /64, where a group such as `0abc` is written `abc`, so a test that spells the key reads the same form.
 */
export function uniqueIpv6Group(): string {
  return `a${randomUUID().slice(0, 3)}`;
}

type Disposable<T> = T & AsyncDisposable;

function disposable<T extends Redis | Cluster>(client: T): Disposable<T> {
  return Object.assign(client, {
    async [Symbol.asyncDispose]() {
      client.disconnect();
      return Promise.resolve();
    },
  });
}

/** A client of the suite's shared Redis. */
export function sharedRedis(options: Omit<RedisOptions, 'replyMapping'> = {}): Disposable<Redis> {
  const { host, port } = inject('redis');
  return disposable(new Redis({ host, port, ...options }));
}

/** A client of the suite's shared 3-master Redis Cluster. */
export function sharedCluster(): Disposable<Cluster> {
  const nodes = inject('redisCluster').map(({ host, port }) => ({ host, port }));
  return disposable(new Cluster(nodes, { enableReadyCheck: true }));
}

/** The backend, for tests that start (and break) servers of their own. */
export function backend(): ServerBackend {
  return selectBackend();
}
