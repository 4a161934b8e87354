/**
 * The environment of each quotaplane process the stack runs: the coordinator (`coordinator/main.ts`) and one
 * agent per region (`regional-agent/main.ts`), each configured only through its documented `QP_*` variables.
 */
import { formatRoundTrips } from '../../core/distance.js';
import {
  SENTINEL_PORT_OFFSET,
  sentinelMasterName,
  type RegionPlan,
  type StackConfig,
  type StackRuntime,
} from './config.js';

/** Marks every process the launcher starts, so a test (or an operator) can find any left behind. */
export const STACK_ID_VAR = 'QUOTAPLANE_STACK_ID';

/** Tokens in force: given or generated. */
export interface StackTokens {
  readonly admin: string;
  readonly read: string;
}

/** The launcher's own environment without any `QP_*` or image variable: children get exactly what is set here. */
export function baseEnv(env: NodeJS.ProcessEnv, stackId: string): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(env)) {
    if (name.startsWith('QP_') || name === 'REDIS_IMAGE' || name === 'NATS_IMAGE') continue;
    out[name] = value;
  }
  out[STACK_ID_VAR] = stackId;
  return out;
}

/**
 * The NATS server a process of `region` connects to: the one server of the single topology, or the region's
 * own in the geo topology (the coordinator's is the first region's). The stack's NATS always runs with TLS and
 * per-process nkeys (docs/security.md).
 */
export function natsUrl(config: StackConfig, region?: string): string {
  const geo = config.geo;
  if (geo === undefined) return `tls://${config.host}:${config.natsPort}`;
  const server = geo.servers.find((s) => s.region === (region ?? config.regions[0]!.name)) ?? geo.servers[0]!;
  return `tls://${config.host}:${server.port}`;
}

/** `redis://host:port` for one Redis, `host:port,…` seeds for a cluster, the sentinels and master name. */
export function redisTarget(config: StackConfig, region: RegionPlan): Record<string, string> {
  const nodes = (offset: number) =>
    region.redis.kind === 'single'
      ? ''
      : region.redis.ports.map((p) => `${config.host}:${p + offset}`).join(',');
  switch (region.redis.kind) {
    case 'single':
      return { QP_REDIS_URL: `redis://${config.host}:${region.redis.port}` };
    case 'cluster':
      return { QP_REDIS_CLUSTER_NODES: nodes(0) };
    case 'sentinel':
      return {
        QP_REDIS_SENTINELS: nodes(SENTINEL_PORT_OFFSET),
        QP_REDIS_MASTER_NAME: sentinelMasterName(region.name),
      };
  }
}

/**
 * What the services need from the stack's secrets bundle (coordinator/nats/secrets-bundle.ts): each its own nkey
 * seed file, the CA of the NATS server's certificate, and the agents' subject secret, as a file unless the
 * operator gave one in `QP_HMAC_SECRET`.
 */
export interface StackSecrets {
  readonly caFile: string;
  nkeyFile(identity: string): string;
  readonly subjectSecret: { readonly QP_HMAC_SECRET: string } | { readonly QP_HMAC_SECRET_FILE: string };
}

/** The NATS identity of the agent of `region` (one agent per region on the local stack). */
export function agentIdentity(region: string): string {
  return `agent-${region}-1`;
}

export function coordinatorEnv(
  config: StackConfig,
  tokens: StackTokens,
  base: NodeJS.ProcessEnv,
  secrets: StackSecrets,
): NodeJS.ProcessEnv {
  return {
    ...base,
    QP_LOG_LEVEL: config.logLevel,
    ...config.coordinatorEnv,
    QP_REGIONS: config.regions.map((r) => r.name).join(','),
    QP_ADMIN_TOKEN: tokens.admin,
    QP_READ_TOKEN: tokens.read,
    QP_NATS_URL: natsUrl(config),
    QP_NATS_NKEY_FILE: secrets.nkeyFile('coordinator'),
    QP_NATS_TLS_CA_FILE: secrets.caFile,
    QP_HOST: config.host,
    QP_PORT: String(config.coordinatorPort),
    QP_KV_NAMESPACE: config.namespace,
  };
}

export function agentEnv(
  config: StackConfig,
  region: RegionPlan,
  base: NodeJS.ProcessEnv,
  secrets: StackSecrets,
): NodeJS.ProcessEnv {
  return {
    ...base,
    QP_LOG_LEVEL: config.logLevel,
    // Forward-auth answers trusted proxies only: on the local stack, whatever runs on its own address.
    QP_TRUSTED_PROXIES: config.host,
    // Geo: each agent knows its round trips, so its deadlines cover the links (an operator's QP_AGENT_ROUND_TRIPS
    // wins, as on a real deployment where the figures are measured).
    ...(config.geo === undefined
      ? {}
      : {
          QP_ROUND_TRIPS: formatRoundTrips(
            config.geo.roundTrips,
            config.regions.map((r) => r.name),
          ),
        }),
    ...config.agentEnv,
    ...secrets.subjectSecret,
    QP_REGION: region.name,
    ...redisTarget(config, region),
    QP_NATS_URL: natsUrl(config, region.name),
    QP_NATS_NKEY_FILE: secrets.nkeyFile(agentIdentity(region.name)),
    QP_NATS_TLS_CA_FILE: secrets.caFile,
    QP_KV_NAMESPACE: config.namespace,
    QP_HOST: config.host,
    QP_PORT: String(region.agentPort),
    QP_GRPC_PORT: String(region.grpcPort),
    QP_INSTANCE: `${region.name}-${config.host}:${region.agentPort}`,
  };
}

/**
 * The command that runs a service: compiled, its JavaScript in dist/ (`npm run build`, as the images compile it);
 * from source, the TypeScript through tsx (what `npm run coordinator` does, without npm in between).
 */
export function serviceCommand(
  entry: 'coordinator/main.ts' | 'regional-agent/main.ts',
  runtime: StackRuntime = 'source',
): {
  command: string;
  args: string[];
} {
  if (runtime === 'compiled') return { command: process.execPath, args: [compiledEntry(entry)] };
  return { command: process.execPath, args: ['--import', 'tsx', entry] };
}

/** Where `npm run build` writes a service's entry point (relative to the repository). */
export function compiledEntry(entry: 'coordinator/main.ts' | 'regional-agent/main.ts'): string {
  return `dist/${entry.replace(/\.ts$/, '.js')}`;
}
