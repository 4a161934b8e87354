/**
 * Starts the servers the whole suite shares: one Redis, one NATS with JetStream and a 3-master Redis Cluster,
 * each on free loopback ports, and stops them afterwards. Tests that break a server start their own. Builds
 * `@quotaplane/client` first when its build is older than its sources, and first of all installs the system
 * packages the tier needs when they are missing, as `.ci/run` does (system-packages.ts); what it could not install
 * is provided to the tests that need it (`missingPackages`), which fail saying why.
 */
import type { TestProject } from 'vitest/node';
import { ensureClientBuilt } from './client-build.js';
import { selectBackend } from './select-backend.js';
import {
  ensureSystemPackages,
  INSTALL_LINE,
  SYSTEM_PACKAGES,
  type MissingPackage,
} from './system-packages.js';

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
    /** System packages still missing after the setup, with the reason (system-packages.ts). */
    missingPackages: MissingPackage[];
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const backend = selectBackend();
  // The containers backend runs Redis and NATS in images: only the browser and nginx come from the host.
  const servers = new Set(['redis-server', 'redis-tools', 'nats-server']);
  const missing = await ensureSystemPackages({
    packages: SYSTEM_PACKAGES.filter((p) => backend.name === 'process' || !servers.has(p.name)),
  });
  const noServers = missing.filter((m) => servers.has(m.name));
  if (noServers.length > 0) {
    throw new Error(
      `the integration tests run real Redis and NATS servers: ${noServers.map((m) => m.reason).join('; ')}. ` +
        `Every package the tests need: ${INSTALL_LINE}`,
    );
  }
  project.provide('missingPackages', missing);
  ensureClientBuilt();
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
