/**
 * Ports before anything starts: every fixed port is checked free (a taken one is named with the variable that
 * moves it), and every 0 is replaced by a free port, so the launcher never leaves half a stack behind because
 * of a port.
 */
import { createServer } from 'node:net';
import {
  CLUSTER_BUS_OFFSET,
  CLUSTER_MASTERS,
  plannedPorts,
  type GeoLinkPlan,
  type GeoServerPlan,
  type PlannedPort,
  type RegionPlan,
  type StackConfig,
} from './config.js';

/** Whether `host:port` can be listened on right now. */
export function isPortFree(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once('error', () => resolve(false));
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(true)));
  });
}

/** A port the OS gave out a moment ago on `host`. */
export function anyFreePort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', reject);
    server.listen({ host, port: 0, exclusive: true }, () => {
      const address = server.address();
      server.close(() => {
        if (address !== null && typeof address === 'object') resolve(address.port);
        else reject(new Error('the OS gave no port'));
      });
    });
  });
}

/** The planned ports that are taken (fixed ones only). */
export async function takenPorts(config: StackConfig): Promise<PlannedPort[]> {
  const fixed = plannedPorts(config).filter((p) => p.port !== 0);
  const free = await Promise.all(fixed.map((p) => isPortFree(config.host, p.port)));
  return fixed.filter((_, i) => !free[i]);
}

/** One line per taken port, naming what it was for and how to move it. */
export function describeTaken(taken: readonly PlannedPort[]): string {
  const lines = taken.map(
    (p) => `  - port ${p.port} (${p.name}) is already in use; set ${p.env} to another port`,
  );
  return `cannot start the stack: ${taken.length === 1 ? 'a port is' : 'ports are'} taken\n${lines.join('\n')}`;
}

/**
 * Three consecutive free ports whose cluster bus ports (+10000) are free too, none of them in `avoid`. Drawn
 * below the OS's ephemeral range so the bus ports stay under 65536.
 */
async function freeClusterBase(host: string, avoid: Set<number>, random: () => number): Promise<number> {
  for (let attempt = 0; attempt < 200; attempt++) {
    const base = 20_000 + Math.floor(random() * 20_000);
    const ports = Array.from({ length: CLUSTER_MASTERS }, (_, i) => base + i);
    const all = [...ports, ...ports.map((p) => p + CLUSTER_BUS_OFFSET)];
    if (all.some((p) => avoid.has(p))) continue;
    const free = await Promise.all(all.map((p) => isPortFree(host, p)));
    if (free.every(Boolean)) return base;
  }
  throw new Error('found no three consecutive free ports for a Redis Cluster');
}

/** The same plan with every 0 port replaced by a free one (distinct from every other port of the plan). */
export async function resolvePorts(
  config: StackConfig,
  random: () => number = Math.random,
): Promise<StackConfig> {
  const used = new Set(plannedPorts(config).map((p) => p.port));
  const pick = async (port: number): Promise<number> => {
    if (port !== 0) return port;
    for (;;) {
      const candidate = await anyFreePort(config.host);
      if (!used.has(candidate) && !used.has(candidate + CLUSTER_BUS_OFFSET)) {
        used.add(candidate);
        return candidate;
      }
    }
  };
  const coordinatorPort = await pick(config.coordinatorPort);
  const natsPort = config.geo === undefined ? await pick(config.natsPort) : config.natsPort;
  let geo = config.geo;
  if (geo !== undefined) {
    const servers: GeoServerPlan[] = [];
    for (const s of geo.servers) {
      servers.push({
        region: s.region,
        port: await pick(s.port),
        routePort: await pick(s.routePort),
        monitorPort: await pick(s.monitorPort),
      });
    }
    const links: GeoLinkPlan[] = [];
    for (const l of geo.links) links.push({ ...l, port: await pick(l.port) });
    geo = { ...geo, servers, links, controlPort: await pick(geo.controlPort) };
  }
  const regions: RegionPlan[] = [];
  for (const region of config.regions) {
    const agentPort = await pick(region.agentPort);
    const grpcPort = await pick(region.grpcPort);
    let redis = region.redis;
    if (redis.kind === 'single') {
      redis = { kind: 'single', port: await pick(redis.port) };
    } else if (redis.ports[0] === 0) {
      const base = await freeClusterBase(config.host, used, random);
      const ports = Array.from({ length: CLUSTER_MASTERS }, (_, i) => base + i);
      for (const p of ports) used.add(p).add(p + CLUSTER_BUS_OFFSET);
      redis = { kind: redis.kind, ports };
    }
    regions.push({ name: region.name, agentPort, grpcPort, redis });
  }
  return Object.freeze({ ...config, coordinatorPort, natsPort, regions, geo });
}
