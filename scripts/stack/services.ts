/**
 * The environment of each quotaplane process the stack runs: the coordinator (`coordinator/main.ts`) and one
 * agent per region (`regional-agent/main.ts`), each configured only through its documented `QP_*` variables.
 */
import type { RegionPlan, StackConfig } from './config.js';

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

export function natsUrl(config: StackConfig): string {
  return `nats://${config.host}:${config.natsPort}`;
}

/** `redis://host:port` for one Redis, `host:port,…` seeds for a cluster. */
export function redisTarget(config: StackConfig, region: RegionPlan): Record<string, string> {
  return region.redis.kind === 'single'
    ? { QP_REDIS_URL: `redis://${config.host}:${region.redis.port}` }
    : { QP_REDIS_CLUSTER_NODES: region.redis.ports.map((p) => `${config.host}:${p}`).join(',') };
}

export function coordinatorEnv(
  config: StackConfig,
  tokens: StackTokens,
  base: NodeJS.ProcessEnv,
): NodeJS.ProcessEnv {
  return {
    ...base,
    QP_LOG_LEVEL: config.logLevel,
    ...config.coordinatorEnv,
    QP_REGIONS: config.regions.map((r) => r.name).join(','),
    QP_ADMIN_TOKEN: tokens.admin,
    QP_READ_TOKEN: tokens.read,
    QP_NATS_URL: natsUrl(config),
    QP_HOST: config.host,
    QP_PORT: String(config.coordinatorPort),
    QP_KV_NAMESPACE: config.namespace,
  };
}

export function agentEnv(
  config: StackConfig,
  region: RegionPlan,
  base: NodeJS.ProcessEnv,
): NodeJS.ProcessEnv {
  return {
    ...base,
    QP_LOG_LEVEL: config.logLevel,
    ...config.agentEnv,
    QP_REGION: region.name,
    ...redisTarget(config, region),
    QP_NATS_URL: natsUrl(config),
    QP_KV_NAMESPACE: config.namespace,
    QP_HOST: config.host,
    QP_PORT: String(region.agentPort),
    QP_INSTANCE: `${region.name}-${config.host}:${region.agentPort}`,
  };
}

/** The command that runs a service from source (what `npm run coordinator` does, without npm in between). */
export function serviceCommand(entry: 'coordinator/main.ts' | 'regional-agent/main.ts'): {
  command: string;
  args: string[];
} {
  return { command: process.execPath, args: ['--import', 'tsx', entry] };
}
