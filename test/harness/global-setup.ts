/**
 * Starts the servers the whole suite shares: one Redis, one NATS with JetStream and a 3-master Redis Cluster,
 * each on free loopback ports, and stops them afterwards. Tests that break a server start their own. Builds
 * `@quotaplane/client` first when its build is older than its sources.
 */
import type { TestProject } from 'vitest/node';
import { ensureClientBuilt } from './client-build.js';
import { selectBackend } from './select-backend.js';

export interface Endpoint {
  host: string;
  port: number;
  url: string;
}

declare module 'vitest' {
  export interface ProvidedContext {
    redis: Endpoint;
    nats: Endpoint;
    redisCluster: Endpoint[];
    backend: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  ensureClientBuilt();
  const backend = selectBackend();
  const [redis, nats, cluster] = await Promise.all([
    backend.startRedis(),
    backend.startNats({ jetstream: true }),
    backend.startRedisCluster(3),
  ]);
  const endpoint = (s: { host: string; port: number; url: string }): Endpoint => ({
    host: s.host,
    port: s.port,
    url: s.url,
  });
  project.provide('redis', endpoint(redis));
  project.provide('nats', endpoint(nats));
  project.provide('redisCluster', cluster.nodes.map(endpoint));
  project.provide('backend', backend.name);
  return async () => {
    await Promise.all([
      redis[Symbol.asyncDispose](),
      nats[Symbol.asyncDispose](),
      cluster[Symbol.asyncDispose](),
    ]);
  };
}
