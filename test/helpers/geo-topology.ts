/**
 * Regions a WAN apart, for tests: one NATS server per region, the three joined in one cluster whose routes cross
 * delaying proxies (test/load/delay-proxy-main.ts, a process of its own so a busy test does not stretch the
 * delays), one Redis per region. Each region's clients connect to their own server at local speed; everything
 * between regions crosses a proxy with the matrix's round trip, ±jitter, and a partition switch. Every server
 * runs JetStream, so a KV bucket or stream may have three replicas, one per region. `no_advertise` keeps gossip
 * from telling clients of other regions' servers, and each server advertises a route address where nothing
 * listens so gossip cannot open a route around the proxies; `directRoutes()` checks it from outside, on the
 * servers' /routez.
 *
 *   await using geo = await startGeoTopology();            // us, eu, ap at us-eu 70, us-ap 150, eu-ap 220 ms
 *   geo.natsUrl('ap'); geo.redis('ap').url;                 // what an ap agent connects to
 *   await geo.partition('ap'); await geo.heal('ap');        // cut every link of ap, then accept again
 *   await geo.setRoundTrip('us', 'ap', 300);                // both directions, from the next chunk on
 *   await geo.nats('us').stop(); await geo.nats('us').start();   // a region's server down and back
 *
 * docs/running.md describes the same topology as `npm start -- --geo` runs it.
 */
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureSecretsBundle } from '../../coordinator/nats/secrets-bundle.js';
import { serverConfig } from '../../coordinator/nats/credentials.js';
import {
  DEFAULT_LINK_JITTER,
  DEFAULT_ROUND_TRIPS,
  missingPairs,
  parseRoundTrips,
  roundTripOf,
  type RoundTrips,
} from '../../core/distance.js';
import type { NatsSecurity, NatsServer, RedisServer, SecureNatsOptions } from '../harness/backend.js';
import { backend } from '../harness/fixtures.js';
import { natsSecurity } from '../harness/nats-security.js';
import { freePort } from '../harness/ports.js';
import { geoCluster, geoProxySpec, geoServerName, linkName } from '../../scripts/stack/geo.js';
import { monitorJson, natsClusterFormed, until } from '../../scripts/stack/probes.js';
import { spawnProxies, type LinkControl, type LinkState, type ProxyProcess } from './tcp-proxy.js';

const ROOT = new URL('../..', import.meta.url).pathname;
const HOST = '127.0.0.1';
export interface GeoOptions {
  /** Default us, eu, ap. */
  readonly regions?: readonly string[];
  /** Round trips between regions (`us-eu=70,…` or parsed); default DEFAULT_ROUND_TRIPS. Every pair is needed. */
  readonly roundTrips?: string | RoundTrips;
  /** Jitter of every link, a fraction of its delay; default 0.1 (±10 %). */
  readonly jitter?: number;
  /** One Redis per region (default true). */
  readonly redis?: boolean;
  /** Lock the servers down as a deployment does (nkeys, permissions, optional TLS); default open. */
  readonly secure?: Omit<SecureNatsOptions, 'regions'>;
}

/** One route as a server's /routez lists it. */
export interface RouteInfo {
  readonly remoteName: string;
  readonly port: number;
  readonly solicited: boolean;
}

export interface GeoTopology extends AsyncDisposable {
  readonly regions: readonly string[];
  readonly roundTrips: RoundTrips;
  /** The region's NATS server (stop, start, pause it like any harness server). */
  nats(region: string): NatsServer;
  /** What a client of the region connects to. */
  natsUrl(region: string): string;
  /** The region's Redis (throws when started with `redis: false`). */
  redis(region: string): RedisServer;
  /** The region's server's HTTP monitoring base URL (`/routez`, `/jsz`, `/healthz`). */
  monitorUrl(region: string): string;
  /** Credentials of the locked-down servers (one bundle for all three); undefined when open. */
  readonly security: NatsSecurity | undefined;
  /** The proxies' control API (links(), partition(), setRoundTrip() …). */
  readonly links: LinkControl;
  /** The configured round trip between two regions, ms (0 within one). */
  roundTripMs(a: string, b: string): number;
  setRoundTrip(a: string, b: string, roundTripMs: number, jitter?: number): Promise<void>;
  /** Cut every link of `region` (sockets closed, new ones refused): its server is alone. */
  partition(region: string): Promise<void>;
  heal(region: string): Promise<void>;
  /** Cut, or restore, the links between two regions. */
  cut(a: string, b: string): Promise<void>;
  restore(a: string, b: string): Promise<void>;
  /** The routes `region`'s server holds now. */
  routes(region: string): Promise<RouteInfo[]>;
  /**
   * Routes that do not cross a proxy (whose peer port is neither a link's nor one a link dialled from): empty
   * when the topology is what it claims.
   */
  directRoutes(): Promise<string[]>;
  /**
   * Resolve once every server routes to every other and JetStream's meta leader sees every other server current
   * (a stream with three replicas can be placed); throws after `timeoutMs`.
   */
  formed(timeoutMs?: number): Promise<void>;
}

export async function startGeoTopology(options: GeoOptions = {}): Promise<GeoTopology> {
  const regions = options.regions ?? ['us', 'eu', 'ap'];
  const given = options.roundTrips ?? DEFAULT_ROUND_TRIPS;
  let roundTrips: RoundTrips;
  if (typeof given === 'string') {
    const parsed = parseRoundTrips(given, regions);
    if (!parsed.ok) throw new Error(`round trips: ${parsed.problems.join('; ')}`);
    roundTrips = parsed.roundTrips;
  } else roundTrips = given;
  const missing = missingPairs(roundTrips, regions);
  if (missing.length > 0) throw new Error(`round trips: no round trip for ${missing.join(', ')}`);
  const jitter = options.jitter ?? DEFAULT_LINK_JITTER;
  const b = backend();
  const dir = mkdtempSync(join(tmpdir(), 'qp-geo-'));
  const ports = new Map<string, { client: number; route: number; monitor: number }>();
  for (const region of regions) {
    ports.set(region, { client: await freePort(), route: await freePort(), monitor: await freePort() });
  }
  const servers = new Map<string, NatsServer>();
  const redis = new Map<string, RedisServer>();
  let proxies: ProxyProcess | undefined;
  const stop = async () => {
    await Promise.all([...servers.values()].map((s) => s[Symbol.asyncDispose]()));
    await Promise.all([...redis.values()].map((s) => s[Symbol.asyncDispose]()));
    await proxies?.[Symbol.asyncDispose]();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    proxies = await spawnProxies(
      geoProxySpec({
        host: HOST,
        regions,
        roundTrips,
        jitter,
        routePort: (region) => ports.get(region)!.route,
      }),
      ROOT,
    );
    const linkPorts = proxies.ports.links;
    const security =
      options.secure === undefined
        ? undefined
        : natsSecurity(join(dir, 'secrets'), { ...options.secure, regions }, {});
    const starts = regions.map(async (region) => {
      const own = ports.get(region)!;
      const nodeDir = join(dir, region);
      mkdirSync(nodeDir, { recursive: true });
      if (security !== undefined) cpSync(security.bundle.dir, join(nodeDir, 'secrets'), { recursive: true });
      const cluster = geoCluster(
        HOST,
        region,
        regions,
        own.route,
        (from, to) => linkPorts[linkName(from, to)]!,
      );
      const server = await b.startNatsNode({
        port: own.client,
        dir: nodeDir,
        security,
        config: (view) => {
          const common = {
            host: HOST,
            port: own.client,
            monitorPort: own.monitor,
            serverName: geoServerName(region),
            cluster,
            jetstreamDir: view.storeDir,
          };
          if (security === undefined)
            return serverConfig({ namespace: 'unused', credentials: [], ...common });
          // The bundle's copy in the server's files: users, permissions and TLS files as the server sees them.
          const bundle = ensureSecretsBundle(join(nodeDir, 'secrets'), {
            namespace: options.secure!.namespace,
            regions,
            ...(options.secure!.agentsPerRegion !== undefined
              ? { agentsPerRegion: options.secure!.agentsPerRegion }
              : {}),
            ...(options.secure!.tls === true ? { tls: { altNames: [HOST, 'localhost'] } } : {}),
            serverDir: `${view.dir}/secrets`,
            configFile: join(nodeDir, 'secrets', 'nats-server.conf'),
            ...common,
          });
          return readFileSync(bundle.configFile, 'utf8');
        },
      });
      servers.set(region, server);
    });
    await Promise.all(starts);
    if (options.redis ?? true) {
      for (const region of regions) redis.set(region, await b.startRedis());
    }
    const control = proxies.control;
    const monitorUrl = (region: string) => `http://${HOST}:${ports.get(region)!.monitor}`;
    // Server ids change at every start: names are read from each server's /varz when a route names an id.
    const names = new Map<string, string>();
    const nameOf = async (id: string): Promise<string> => {
      if (!names.has(id)) {
        for (const region of regions) {
          const varz = await monitorJson(`${monitorUrl(region)}/varz`);
          if (typeof varz?.['server_id'] === 'string')
            names.set(varz['server_id'], String(varz['server_name']));
        }
      }
      return names.get(id) ?? id;
    };
    const routes = async (region: string): Promise<RouteInfo[]> => {
      const z = await monitorJson(`${monitorUrl(region)}/routez`);
      const list = (z?.['routes'] ?? []) as { remote_id: string; port: number; did_solicit: boolean }[];
      return Promise.all(
        list.map(async (r) => ({
          remoteName: await nameOf(r.remote_id),
          port: r.port,
          solicited: r.did_solicit,
        })),
      );
    };
    const known = <T>(map: Map<string, T>, region: string, what: string): T => {
      const value = map.get(region);
      if (value === undefined) throw new Error(`no ${what} for region ${region}`);
      return value;
    };
    const topology: GeoTopology = {
      regions,
      roundTrips,
      security,
      links: control,
      nats: (region) => known(servers, region, 'NATS server'),
      natsUrl: (region) => known(servers, region, 'NATS server').url,
      redis: (region) => known(redis, region, 'Redis'),
      monitorUrl,
      roundTripMs: (a, c) => {
        const ms = roundTripOf(roundTrips, a, c);
        if (ms === undefined) throw new Error(`no round trip between ${a} and ${c}`);
        return ms;
      },
      setRoundTrip: (a, c, ms, j) => control.setRoundTrip(a, c, ms, j),
      partition: (region) => control.partition(region),
      heal: (region) => control.heal(region),
      cut: (a, c) => control.cut(a, c),
      restore: (a, c) => control.restore(a, c),
      routes,
      async directRoutes() {
        const links: LinkState[] = await control.links();
        // The peer's port of a route through a proxy is the proxy's own (this server dialled it) or one the
        // proxy dialled from (the peer's route came through it). Not the direction: a server that drops a
        // duplicate route marks the one it keeps as solicited, whichever side opened it.
        const through = new Set(links.flatMap((l) => [l.port, ...l.upstreamPorts]));
        const out: string[] = [];
        for (const region of regions) {
          for (const r of await routes(region)) {
            if (!through.has(r.port)) out.push(`${region} → ${r.remoteName} (peer port ${r.port})`);
          }
        }
        return out;
      },
      async formed(timeoutMs = 30_000) {
        await until(
          () => natsClusterFormed(regions.map(monitorUrl)),
          timeoutMs,
          'the NATS cluster did not form',
        );
      },
      [Symbol.asyncDispose]: stop,
    };
    await topology.formed();
    return topology;
  } catch (error) {
    await stop();
    throw error;
  }
}
