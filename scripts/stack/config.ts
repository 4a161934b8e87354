/**
 * The local stack's configuration: environment variables read once by `scripts/stack.ts`, validated by one zod
 * schema that holds every default, with every problem listed at once. docs/running.md has the table.
 */
import { isIP } from 'node:net';
import { z } from 'zod';
import { MIN_TOKEN_LENGTH } from '../../coordinator/config.js';
import {
  DEFAULT_LINK_JITTER,
  DEFAULT_ROUND_TRIPS,
  missingPairs,
  parseRoundTrips,
  type RoundTrips,
} from '../../core/distance.js';
import { DEFAULT_KV_NAMESPACE, KvNamespace } from '../../core/wire/kv.js';

/** The stack's regions, in order: agent ports and Redis ports are named after them. */
export const STACK_REGIONS = ['us', 'eu', 'ap'] as const;
export type StackRegion = (typeof STACK_REGIONS)[number];

/** Nodes of a region that runs on a Redis Cluster: masters on P, P+1, P+2 (cluster bus on each + 10000). */
export const CLUSTER_MASTERS = 3;
/** Redis puts a node's cluster bus on its port + 10000. */
export const CLUSTER_BUS_OFFSET = 10_000;
/**
 * A region under Sentinel: its master on P, replicas on P+1 and P+2, and a sentinel beside each on its port +
 * 10000 (where a cluster node's bus would be), so a region takes the same ports in either layout.
 */
export const SENTINEL_PORT_OFFSET = CLUSTER_BUS_OFFSET;
/** The master name a sentinel region's sentinels monitor: `qp-<region>`. */
export function sentinelMasterName(region: string): string {
  return `qp-${region}`;
}

/**
 * How the regions are joined: `single`, one NATS server for all three on loopback; `geo`, one NATS server per
 * region in one cluster whose routes cross delaying proxies, so the regions are a WAN apart (docs/running.md).
 */
export const StackTopology = z.enum(['single', 'geo']);
export type StackTopology = z.infer<typeof StackTopology>;
/**
 * How the coordinator and the agents run: `compiled`, the JavaScript `npm run build` wrote to dist/ (what `npm
 * start` runs, as the images do); `source`, the TypeScript through tsx (tests that start the launcher directly).
 */
export const StackRuntime = z.enum(['source', 'compiled']);
export type StackRuntime = z.infer<typeof StackRuntime>;

/** The geo topology's links: the server of `from` reaches the server of `to` through the link's port. */
export const GEO_LINKS: readonly (readonly [StackRegion, StackRegion])[] = STACK_REGIONS.flatMap((from) =>
  STACK_REGIONS.filter((to) => to !== from).map((to) => [from, to] as const),
);

/** Where redis-server and nats-server come from. */
export const ServerSource = z.enum(['auto', 'binaries', 'docker']);
export type ServerSource = z.infer<typeof ServerSource>;

const Port = z.coerce
  .number({ error: 'ports are integers 0-65535 (0: any free port)' })
  .int('ports are integers 0-65535 (0: any free port)')
  .min(0, 'ports are integers 0-65535 (0: any free port)')
  .max(65_535, 'ports are integers 0-65535 (0: any free port)');

const bool = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'], { error: 'use true or false' })
  .transform((v) => v === 'true' || v === '1' || v === 'yes');

/** Where `npm start` writes the running stack's tokens and coordinator address for another shell to source. */
export const DEFAULT_ENV_FILE = '.quotaplane/stack.env';

const Token = z
  .string()
  .min(MIN_TOKEN_LENGTH, `tokens must be at least ${MIN_TOKEN_LENGTH} characters`)
  .max(512, 'tokens must be at most 512 characters')
  .regex(/^[\x21-\x7e]+$/, 'tokens are printable ASCII without spaces');

const LogLevel = z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']);

const regionList = z
  .string()
  .transform((v) =>
    v
      .split(',')
      .map((s) => s.trim())
      .filter((s) => s.length > 0),
  )
  .pipe(z.array(z.enum(STACK_REGIONS, { error: `regions are ${STACK_REGIONS.join(', ')}` })));

/** Environment variables the launcher reads (besides the `QP_COORDINATOR_*` / `QP_AGENT_*` pass-through). */
export const StackEnv = z
  .object({
    QP_ADMIN_TOKEN: Token.optional(),
    QP_READ_TOKEN: Token.optional(),
    QP_STACK_HOST: z
      .string()
      .default('127.0.0.1')
      .refine((v) => isIP(v) !== 0, 'QP_STACK_HOST is an IP address, e.g. 127.0.0.1'),
    QP_STACK_COORDINATOR_PORT: Port.default(7100),
    QP_STACK_US_PORT: Port.default(7101),
    QP_STACK_EU_PORT: Port.default(7102),
    QP_STACK_AP_PORT: Port.default(7103),
    QP_STACK_NATS_PORT: Port.default(7110),
    QP_STACK_US_REDIS_PORT: Port.default(7111),
    QP_STACK_EU_REDIS_PORT: Port.default(7121),
    QP_STACK_AP_REDIS_PORT: Port.default(7131),
    QP_STACK_US_GRPC_PORT: Port.default(7141),
    QP_STACK_EU_GRPC_PORT: Port.default(7142),
    QP_STACK_AP_GRPC_PORT: Port.default(7143),
    QP_STACK_TOPOLOGY: StackTopology.default('single'),
    QP_STACK_RUNTIME: StackRuntime.default('source'),
    // Geo topology only: each region's NATS server (clients, routes, monitoring), the links between them and
    // the links' control API.
    QP_STACK_US_NATS_PORT: Port.default(7114),
    QP_STACK_EU_NATS_PORT: Port.default(7124),
    QP_STACK_AP_NATS_PORT: Port.default(7134),
    QP_STACK_US_ROUTE_PORT: Port.default(7115),
    QP_STACK_EU_ROUTE_PORT: Port.default(7125),
    QP_STACK_AP_ROUTE_PORT: Port.default(7135),
    QP_STACK_US_MONITOR_PORT: Port.default(7116),
    QP_STACK_EU_MONITOR_PORT: Port.default(7126),
    QP_STACK_AP_MONITOR_PORT: Port.default(7136),
    QP_STACK_LINKS_PORT: Port.default(7150),
    QP_STACK_US_EU_LINK_PORT: Port.default(7151),
    QP_STACK_US_AP_LINK_PORT: Port.default(7152),
    QP_STACK_EU_US_LINK_PORT: Port.default(7153),
    QP_STACK_EU_AP_LINK_PORT: Port.default(7154),
    QP_STACK_AP_US_LINK_PORT: Port.default(7155),
    QP_STACK_AP_EU_LINK_PORT: Port.default(7156),
    QP_STACK_ROUND_TRIPS: z.string().default(DEFAULT_ROUND_TRIPS),
    QP_STACK_LINK_JITTER: z.coerce
      .number({ error: 'QP_STACK_LINK_JITTER is a fraction in [0, 1)' })
      .min(0, 'QP_STACK_LINK_JITTER is a fraction in [0, 1)')
      .lt(1, 'QP_STACK_LINK_JITTER is a fraction in [0, 1)')
      .default(DEFAULT_LINK_JITTER),
    QP_STACK_CLUSTER_REGIONS: regionList.default([]),
    QP_STACK_SENTINEL_REGIONS: regionList.default([]),
    QP_STACK_SERVERS: ServerSource.default('auto'),
    QP_STACK_DATA_DIR: z.string().min(1).optional(),
    QP_STACK_SECRETS_DIR: z.string().min(1).optional(),
    QP_HMAC_SECRET: z.string().min(16, 'QP_HMAC_SECRET must be at least 16 characters').optional(),
    QP_STACK_KEEP_DATA: bool.default(false),
    QP_STACK_STATE_FILE: z.string().min(1).optional(),
    // Empty: none. The default is relative to the directory the launcher runs in (the clone, for npm start).
    QP_STACK_ENV_FILE: z.string().default(DEFAULT_ENV_FILE),
    QP_STACK_SEED: bool.default(true),
    QP_STACK_READY_TIMEOUT_MS: z.coerce.number().int().min(1000).max(600_000).default(90_000),
    QP_STACK_LOG_LEVEL: LogLevel.default('info'),
    QP_KV_NAMESPACE: KvNamespace.default(DEFAULT_KV_NAMESPACE),
    REDIS_IMAGE: z.string().min(1).default('redis:7.2-alpine'),
    NATS_IMAGE: z.string().min(1).default('nats:2.10-alpine'),
  })
  .superRefine((env, ctx) => {
    if (env.QP_ADMIN_TOKEN !== undefined && env.QP_ADMIN_TOKEN === env.QP_READ_TOKEN) {
      ctx.addIssue({ code: 'custom', path: ['QP_READ_TOKEN'], message: 'must differ from QP_ADMIN_TOKEN' });
    }
    if (new Set(env.QP_STACK_CLUSTER_REGIONS).size !== env.QP_STACK_CLUSTER_REGIONS.length) {
      ctx.addIssue({ code: 'custom', path: ['QP_STACK_CLUSTER_REGIONS'], message: 'regions must be unique' });
    }
    if (new Set(env.QP_STACK_SENTINEL_REGIONS).size !== env.QP_STACK_SENTINEL_REGIONS.length) {
      ctx.addIssue({
        code: 'custom',
        path: ['QP_STACK_SENTINEL_REGIONS'],
        message: 'regions must be unique',
      });
    }
    const both = env.QP_STACK_SENTINEL_REGIONS.filter((r) => env.QP_STACK_CLUSTER_REGIONS.includes(r));
    if (both.length > 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['QP_STACK_SENTINEL_REGIONS'],
        message: `a region is on a cluster or under Sentinel, not both: ${both.join(', ')}`,
      });
    }
  });
export type StackEnv = z.output<typeof StackEnv>;

/** Every port variable of the launcher, for tools that start a stack off the defaults (0: any free port). */
export const STACK_PORT_VARS: readonly string[] = Object.keys(StackEnv.shape).filter((k) =>
  k.endsWith('_PORT'),
);

/** Where one region's buckets live. */
export type RedisLayout =
  | { readonly kind: 'single'; readonly port: number }
  | { readonly kind: 'cluster'; readonly ports: readonly number[] }
  /** ports: master, then replicas; each node's sentinel on its port + SENTINEL_PORT_OFFSET. */
  | { readonly kind: 'sentinel'; readonly ports: readonly number[] };

/** One region's NATS server in the geo topology. */
export interface GeoServerPlan {
  readonly region: StackRegion;
  /** Clients (the region's agents, and the coordinator in the first region). */
  readonly port: number;
  /** Routes from the other servers (reached through the links). */
  readonly routePort: number;
  /** HTTP monitoring (`/routez`, `/jsz`, `/healthz`). */
  readonly monitorPort: number;
}

/** One direction of a link between regions: `from`'s server dials `port` to reach `to`'s route port. */
export interface GeoLinkPlan {
  readonly from: StackRegion;
  readonly to: StackRegion;
  readonly port: number;
}

/** The geo topology: servers, links, their round trips and jitter, and the links' control API. */
export interface GeoPlan {
  readonly roundTrips: RoundTrips;
  readonly jitter: number;
  readonly controlPort: number;
  readonly servers: readonly GeoServerPlan[];
  readonly links: readonly GeoLinkPlan[];
}

export interface RegionPlan {
  readonly name: StackRegion;
  readonly agentPort: number;
  /** The agent's gRPC rate-limit service (Envoy's RLS). */
  readonly grpcPort: number;
  readonly redis: RedisLayout;
}

/**
 * What the launcher will start. A port of 0 means "any free port": `resolvePorts` replaces it before anything
 * starts; every other port is checked free first.
 */
export interface StackConfig {
  readonly host: string;
  readonly coordinatorPort: number;
  /** The one NATS server of the single topology (unused by the geo topology). */
  readonly natsPort: number;
  readonly regions: readonly RegionPlan[];
  readonly topology: StackTopology;
  /** How the services run (compiled JavaScript from dist/, or TypeScript through tsx). */
  readonly runtime: StackRuntime;
  /** With the geo topology: its servers and links (the coordinator uses the first region's server). */
  readonly geo: GeoPlan | undefined;
  readonly servers: ServerSource;
  /** Given tokens; missing ones are generated at start. */
  readonly adminToken: string | undefined;
  readonly readToken: string | undefined;
  readonly namespace: string;
  readonly dataDir: string | undefined;
  /** NATS credentials, TLS material and the subject secret, kept across runs; default `.quotaplane/secrets`. */
  readonly secretsDir: string | undefined;
  /** The operator's subject secret; the one kept in the secrets directory without it. */
  readonly hmacSecret: string | undefined;
  readonly keepData: boolean;
  readonly stateFile: string | undefined;
  /** The shell file of tokens and addresses another shell sources (`source .quotaplane/stack.env`); none if undefined. */
  readonly envFile: string | undefined;
  readonly seed: boolean;
  readonly readyTimeoutMs: number;
  readonly logLevel: z.infer<typeof LogLevel>;
  readonly images: { readonly redis: string; readonly nats: string };
  /** `QP_*` variables for the coordinator, from `QP_COORDINATOR_*`. */
  readonly coordinatorEnv: Readonly<Record<string, string>>;
  /** `QP_*` variables for every agent, from `QP_AGENT_*`. */
  readonly agentEnv: Readonly<Record<string, string>>;
}

/** Variables the launcher sets on each service itself; a pass-through may not override them. */
export const RESERVED_COORDINATOR_VARS = [
  'QP_REGIONS',
  'QP_ADMIN_TOKEN',
  'QP_READ_TOKEN',
  'QP_NATS_URL',
  'QP_NATS_NKEY_FILE',
  'QP_NATS_TLS_CA_FILE',
  'QP_HOST',
  'QP_PORT',
  'QP_KV_NAMESPACE',
] as const;
export const RESERVED_AGENT_VARS = [
  'QP_REGION',
  'QP_REDIS_URL',
  'QP_REDIS_CLUSTER_NODES',
  'QP_NATS_URL',
  'QP_NATS_NKEY_FILE',
  'QP_NATS_TLS_CA_FILE',
  'QP_HMAC_SECRET',
  'QP_HMAC_SECRET_FILE',
  'QP_HOST',
  'QP_PORT',
  'QP_GRPC_PORT',
  'QP_GRPC_HOST',
  'QP_KV_NAMESPACE',
  'QP_INSTANCE',
] as const;

/** Thrown when the environment is invalid; lists every problem. */
export class StackConfigError extends Error {
  readonly code = 'STACK_CONFIG_INVALID';
  readonly problems: readonly string[];
  constructor(problems: readonly string[]) {
    super(`invalid stack configuration:\n  - ${problems.join('\n  - ')}`);
    this.name = 'StackConfigError';
    this.problems = problems;
  }
}

/** `QP_COORDINATOR_LEASE_MS=3000` → `{ QP_LEASE_MS: '3000' }`. */
function passThrough(
  env: Readonly<Record<string, string | undefined>>,
  prefix: string,
  reserved: readonly string[],
  problems: string[],
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) {
    if (!name.startsWith(prefix) || value === undefined) continue;
    const target = `QP_${name.slice(prefix.length)}`;
    if (target === 'QP_') continue;
    if (reserved.includes(target)) {
      problems.push(`${name}: the launcher sets ${target} itself`);
      continue;
    }
    out[target] = value;
  }
  return out;
}

function regionPort(
  env: StackEnv,
  region: StackRegion,
  what: 'PORT' | 'REDIS_PORT' | 'GRPC_PORT' | 'NATS_PORT' | 'ROUTE_PORT' | 'MONITOR_PORT',
): number {
  const key = `QP_STACK_${region.toUpperCase()}_${what}` as keyof StackEnv;
  return env[key] as number;
}

/** A port the plan asks for: what it is for, and the variable that moves it. */
export interface PlannedPort {
  readonly name: string;
  readonly env: string;
  readonly port: number;
}

/** Ports a plan asks for, in start order; 0 entries included (they are resolved before the start). */
export function plannedPorts(config: StackConfig): PlannedPort[] {
  const out: PlannedPort[] = [
    { name: 'coordinator admin API', env: 'QP_STACK_COORDINATOR_PORT', port: config.coordinatorPort },
  ];
  const geo = config.geo;
  if (geo === undefined) out.push({ name: 'nats', env: 'QP_STACK_NATS_PORT', port: config.natsPort });
  else {
    for (const s of geo.servers) {
      const upper = s.region.toUpperCase();
      out.push(
        { name: `nats ${s.region}`, env: `QP_STACK_${upper}_NATS_PORT`, port: s.port },
        { name: `nats ${s.region} routes`, env: `QP_STACK_${upper}_ROUTE_PORT`, port: s.routePort },
        { name: `nats ${s.region} monitoring`, env: `QP_STACK_${upper}_MONITOR_PORT`, port: s.monitorPort },
      );
    }
    for (const l of geo.links) {
      out.push({ name: `link ${l.from} → ${l.to}`, env: linkPortVar(l.from, l.to), port: l.port });
    }
    out.push({ name: 'links control API', env: 'QP_STACK_LINKS_PORT', port: geo.controlPort });
  }
  for (const region of config.regions) {
    const upper = region.name.toUpperCase();
    out.push({ name: `agent ${region.name}`, env: `QP_STACK_${upper}_PORT`, port: region.agentPort });
    out.push({
      name: `agent ${region.name} gRPC`,
      env: `QP_STACK_${upper}_GRPC_PORT`,
      port: region.grpcPort,
    });
    const env = `QP_STACK_${upper}_REDIS_PORT`;
    if (region.redis.kind === 'single') {
      out.push({ name: `redis ${region.name}`, env, port: region.redis.port });
    } else {
      const sentinel = region.redis.kind === 'sentinel';
      region.redis.ports.forEach((port, i) => {
        const node = sentinel ? (i === 0 ? 'master' : `replica ${i}`) : `node ${i + 1}`;
        out.push({ name: `redis ${region.name} ${node}`, env, port });
        if (port !== 0) {
          out.push({
            name: sentinel
              ? `redis ${region.name} sentinel ${i + 1}`
              : `redis ${region.name} ${node} cluster bus`,
            env,
            port: port + CLUSTER_BUS_OFFSET,
          });
        }
      });
    }
  }
  return out;
}

/** The variable of the link `from` → `to`: `QP_STACK_US_EU_LINK_PORT`. */
export function linkPortVar(from: StackRegion, to: StackRegion): string {
  return `QP_STACK_${from.toUpperCase()}_${to.toUpperCase()}_LINK_PORT`;
}

function geoPlan(e: StackEnv, problems: string[]): GeoPlan | undefined {
  const parsed = parseRoundTrips(e.QP_STACK_ROUND_TRIPS, STACK_REGIONS);
  if (!parsed.ok) {
    for (const p of parsed.problems) problems.push(`QP_STACK_ROUND_TRIPS: ${p}`);
    return undefined;
  }
  const missing = missingPairs(parsed.roundTrips, STACK_REGIONS);
  if (missing.length > 0) {
    problems.push(
      `QP_STACK_ROUND_TRIPS: no round trip for ${missing.join(', ')} (e.g. ${DEFAULT_ROUND_TRIPS})`,
    );
    return undefined;
  }
  return {
    roundTrips: parsed.roundTrips,
    jitter: e.QP_STACK_LINK_JITTER,
    controlPort: e.QP_STACK_LINKS_PORT,
    servers: STACK_REGIONS.map((region) => ({
      region,
      port: regionPort(e, region, 'NATS_PORT'),
      routePort: regionPort(e, region, 'ROUTE_PORT'),
      monitorPort: regionPort(e, region, 'MONITOR_PORT'),
    })),
    links: GEO_LINKS.map(([from, to]) => ({
      from,
      to,
      port: e[linkPortVar(from, to) as keyof StackEnv] as number,
    })),
  };
}

/** Variables whose empty value turns a thing off rather than asking for its default. */
const EMPTY_MEANS_NONE = new Set(['QP_STACK_ENV_FILE']);

/** Build the plan from the environment. Throws StackConfigError listing every problem. */
export function loadStackConfig(env: Readonly<Record<string, string | undefined>>): StackConfig {
  const problems: string[] = [];
  // An empty value is unset, so its default applies; except where empty has a meaning of its own (the env file:
  // none is written).
  const present = Object.fromEntries(
    Object.entries(env).filter(([k, v]) => v !== undefined && (v !== '' || EMPTY_MEANS_NONE.has(k))),
  );
  const parsed = StackEnv.safeParse(present);
  const coordinatorEnv = passThrough(env, 'QP_COORDINATOR_', RESERVED_COORDINATOR_VARS, problems);
  const agentEnv = passThrough(env, 'QP_AGENT_', RESERVED_AGENT_VARS, problems);
  if (!parsed.success) {
    for (const issue of parsed.error.issues) {
      problems.push(`${issue.path.length > 0 ? String(issue.path[0]) : 'environment'}: ${issue.message}`);
    }
    throw new StackConfigError(problems);
  }
  const e = parsed.data;
  const clustered = new Set<StackRegion>(e.QP_STACK_CLUSTER_REGIONS);
  const sentinelled = new Set<StackRegion>(e.QP_STACK_SENTINEL_REGIONS);
  const regions: RegionPlan[] = STACK_REGIONS.map((name) => {
    const base = regionPort(e, name, 'REDIS_PORT');
    const three = Array.from({ length: CLUSTER_MASTERS }, (_, i) => (base === 0 ? 0 : base + i));
    const redis: RedisLayout = clustered.has(name)
      ? { kind: 'cluster', ports: three }
      : sentinelled.has(name)
        ? { kind: 'sentinel', ports: three }
        : { kind: 'single', port: base };
    return {
      name,
      agentPort: regionPort(e, name, 'PORT'),
      grpcPort: regionPort(e, name, 'GRPC_PORT'),
      redis,
    };
  });
  for (const region of regions) {
    const top = region.redis.kind === 'single' ? 0 : Math.max(...region.redis.ports);
    if (top !== 0 && top + CLUSTER_BUS_OFFSET > 65_535) {
      problems.push(
        `QP_STACK_${region.name.toUpperCase()}_REDIS_PORT: a cluster or Sentinel region needs ports P..P+2 and P+10000..P+10002 ≤ 65535`,
      );
    }
  }
  const config: StackConfig = {
    host: e.QP_STACK_HOST,
    coordinatorPort: e.QP_STACK_COORDINATOR_PORT,
    natsPort: e.QP_STACK_NATS_PORT,
    regions,
    topology: e.QP_STACK_TOPOLOGY,
    runtime: e.QP_STACK_RUNTIME,
    geo: e.QP_STACK_TOPOLOGY === 'geo' ? geoPlan(e, problems) : undefined,
    servers: e.QP_STACK_SERVERS,
    adminToken: e.QP_ADMIN_TOKEN,
    readToken: e.QP_READ_TOKEN,
    namespace: e.QP_KV_NAMESPACE,
    dataDir: e.QP_STACK_DATA_DIR,
    secretsDir: e.QP_STACK_SECRETS_DIR,
    hmacSecret: e.QP_HMAC_SECRET,
    keepData: e.QP_STACK_KEEP_DATA,
    stateFile: e.QP_STACK_STATE_FILE,
    envFile: e.QP_STACK_ENV_FILE === '' ? undefined : e.QP_STACK_ENV_FILE,
    seed: e.QP_STACK_SEED,
    readyTimeoutMs: e.QP_STACK_READY_TIMEOUT_MS,
    logLevel: e.QP_STACK_LOG_LEVEL,
    images: { redis: e.REDIS_IMAGE, nats: e.NATS_IMAGE },
    coordinatorEnv,
    agentEnv,
  };
  const seen = new Map<number, string>();
  for (const { name, port } of plannedPorts(config)) {
    if (port === 0) continue;
    const other = seen.get(port);
    if (other !== undefined) problems.push(`port ${port} is asked for twice: ${other} and ${name}`);
    else seen.set(port, name);
  }
  if (problems.length > 0) throw new StackConfigError(problems);
  return Object.freeze(config);
}
