/**
 * The agent's configuration: environment variables (prefix `QP_`) over an optional JSON file
 * (`QP_CONFIG_FILE`), validated once at start by one zod schema that holds every default, with every problem
 * listed at once, and frozen. docs/agent.md has the table.
 */
import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';
import { z } from 'zod';
import { PolicyName, RegionName } from '../core/policy.js';

const bool = z.union([
  z.boolean(),
  z.enum(['true', 'false', '1', '0', 'yes', 'no']).transform((v) => v === 'true' || v === '1' || v === 'yes'),
]);
const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
const num = (min: number, max: number) => z.coerce.number().min(min).max(max);
const list = z.union([
  z.array(z.string()),
  z.string().transform((v) =>
    v
      .split(',')
      .map((s) => s.trim())
      .filter((s) => s.length > 0),
  ),
]);

/** A trusted proxy: an IP address or a CIDR range, IPv4 or IPv6. */
const ProxyRange = z.string().refine((v) => {
  if (isIP(v) !== 0) return true;
  try {
    ipaddr.parseCIDR(v);
    return true;
  } catch {
    return false;
  }
}, 'each trusted proxy must be an IP address or a CIDR range');

/** `host:port` of a Redis Cluster node. */
const ClusterNode = z
  .string()
  .regex(/^[A-Za-z0-9.-]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$/, 'cluster nodes are host:port');

/** Static shares: `{"writes": 0.5}` or `writes=0.5,reads=1`; each share in [0, 1]. */
const StaticShares = z.preprocess(
  (v) => {
    if (typeof v !== 'string') return v;
    const out: Record<string, unknown> = {};
    for (const part of v.split(',').map((s) => s.trim())) {
      if (part.length === 0) continue;
      const at = part.indexOf('=');
      out[at < 0 ? part : part.slice(0, at)] = at < 0 ? undefined : Number(part.slice(at + 1));
    }
    return out;
  },
  z.record(PolicyName, num(0, 1)),
);

const HeaderName = z
  .string()
  .regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/, 'not an HTTP header name')
  .transform((v) => v.toLowerCase());

export const AgentConfig = z
  .strictObject({
    /** Region this agent serves (`us`, `eu-west`). */
    region: RegionName,
    /** One Redis: `redis://host:port/db`. Exactly one of `redisUrl` and `redisClusterNodes`. */
    redisUrl: z.url({ protocol: /^rediss?$/ }).optional(),
    /** Redis Cluster seed nodes, `host:port` each. */
    redisClusterNodes: list.pipe(z.array(ClusterNode).min(1)).optional(),
    /** Longest a decision may take, store calls included, before the policy's failure mode applies. */
    decisionDeadlineMs: int(1, 10_000).default(50),
    /** Proxies whose `X-Forwarded-For` is believed, for forward-auth's client IP. Empty: trust none. */
    trustedProxies: list.pipe(z.array(ProxyRange)).default([]),
    /** Header carrying the subject on `GET /v1/forward-auth`. */
    subjectHeader: HeaderName.default('x-quota-subject'),
    /** Header carrying (and echoing) the request id. */
    requestIdHeader: HeaderName.default('x-request-id'),
    /** When set, subjects are HMAC-hashed before they reach keys and logs (any text up to 1024 chars then). */
    hmacSecret: z.string().min(16, 'hmacSecret must be at least 16 characters').optional(),
    /**
     * NATS servers of the coordinator (comma-separated). When set, policies come from the coordinator's KV bucket,
     * shares from its leases, and strict policies homed elsewhere are forwarded to their home region.
     */
    natsUrl: list.pipe(z.array(z.url({ protocol: /^(nats|tls|wss?)$/ })).min(1)).optional(),
    /** JetStream namespace of the coordinator (its `QP_KV_NAMESPACE`). */
    kvNamespace: z
      .string()
      .regex(/^[a-z][a-z0-9-]{0,31}$/, 'namespaces are 1-32 chars of a-z 0-9 - starting with a-z')
      .default('qp'),
    /** Stable, unique name of this agent process for the coordinator; default `<hostname>:<port>`. */
    instance: z.string().min(1).max(128).optional(),
    /** JSON file of policies: `{ "policies": { "<name>": { …policy body… } } }` (without a coordinator). */
    policiesFile: z.string().min(1).optional(),
    /** Reload the policies file when it changes (it is always reloaded on SIGHUP). */
    policiesWatch: bool.default(false),
    /** Static shares per policy until the coordinator hands out leases. */
    staticShares: StaticShares.default({}),
    /** Share of policies not in `staticShares`. */
    defaultShare: num(0, 1).default(1),
    /** Also send `X-RateLimit-Limit`, `-Remaining`, `-Reset`. */
    legacyHeaders: bool.default(false),
    host: z.string().min(1).default('127.0.0.1'),
    port: int(0, 65_535).default(7101),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    /** Fraction of ordinary decisions logged (degraded ones are logged at this rate too, plus breaker changes). */
    logSampleRate: num(0, 1).default(0.01),
    /** Largest request body. */
    bodyLimitBytes: int(256, 1_048_576).default(16_384),
    /** How long an idempotency record answers retries. */
    idempotencyTtlMs: int(1000, 24 * 3600 * 1000).default(3_600_000),
    /** Circuit breaker: share of failed store calls (in the rolling window) that opens it, in percent. */
    breakerErrorPercent: int(1, 100).default(50),
    /** Circuit breaker: calls in the window before it may open. */
    breakerVolumeThreshold: int(1, 10_000).default(10),
    /** Circuit breaker: how long it stays open before one trial call. */
    breakerResetMs: int(10, 600_000).default(1000),
    /** Circuit breaker: rolling window. */
    breakerWindowMs: int(100, 600_000).default(10_000),
    /** Emergency bucket (`onStoreFailure: local`): fraction of the region's share it holds. */
    emergencyFraction: num(0.001, 1).default(0.1),
    /** Emergency bucket: most subjects tracked in memory; new subjects beyond it fail closed. */
    emergencyMaxBuckets: int(1, 10_000_000).default(100_000),
    /** After SIGTERM: how long /readyz says 503 before the listener closes, so load balancers notice. */
    drainDelayMs: int(0, 600_000).default(0),
    /** After SIGTERM: longest wait for in-flight requests before connections are cut. */
    shutdownTimeoutMs: int(100, 600_000).default(10_000),
  })
  .superRefine((c, ctx) => {
    for (const problem of crossFieldProblems(c)) ctx.addIssue({ code: 'custom', ...problem });
  });
export type AgentConfig = z.output<typeof AgentConfig>;

/** Rules across fields; checked on raw input too, so they are listed even when other fields are invalid. */
function crossFieldProblems(c: Record<string, unknown>): { path: string[]; message: string }[] {
  const out: { path: string[]; message: string }[] = [];
  if ((c['redisUrl'] === undefined) === (c['redisClusterNodes'] === undefined)) {
    out.push({ path: ['redisUrl'], message: 'set exactly one of QP_REDIS_URL and QP_REDIS_CLUSTER_NODES' });
  }
  if (c['policiesFile'] === undefined && c['natsUrl'] === undefined) {
    out.push({
      path: ['policiesFile'],
      message: 'set QP_NATS_URL (policies and shares from the coordinator) or QP_POLICIES_FILE (standalone)',
    });
  }
  if (c['policiesFile'] !== undefined && c['natsUrl'] !== undefined) {
    out.push({
      path: ['policiesFile'],
      message: 'QP_POLICIES_FILE and QP_NATS_URL exclude each other: policies come from the coordinator',
    });
  }
  return out;
}
export type AgentConfigInput = z.input<typeof AgentConfig>;

/** Environment variable of each field: `decisionDeadlineMs` → `QP_DECISION_DEADLINE_MS`. */
export function envName(field: string): string {
  return 'QP_' + field.replace(/([A-Z])/g, '_$1').toUpperCase();
}

/** Thrown at start when the configuration is invalid; lists every problem. */
export class ConfigError extends Error {
  readonly code = 'AGT_CONFIG_INVALID';
  readonly problems: readonly string[];
  constructor(problems: readonly string[]) {
    super(`invalid agent configuration:\n  - ${problems.join('\n  - ')}`);
    this.name = 'ConfigError';
    this.problems = problems;
  }
}

/**
 * Build the configuration from environment variables over an optional JSON file (its fields are the camelCase
 * names). `readFile` is injected so tests need no files. Throws ConfigError listing every problem.
 */
export function loadConfig(
  env: Readonly<Record<string, string | undefined>>,
  readFile: (path: string) => string = () => {
    throw new Error('no file reader');
  },
): Readonly<AgentConfig> {
  const problems: string[] = [];
  let fromFile: Record<string, unknown> = {};
  const file = env['QP_CONFIG_FILE'];
  if (file !== undefined && file !== '') {
    try {
      const parsed: unknown = JSON.parse(readFile(file));
      if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
        problems.push(`QP_CONFIG_FILE ${file}: must hold a JSON object`);
      } else {
        fromFile = parsed as Record<string, unknown>;
      }
    } catch (error) {
      problems.push(`QP_CONFIG_FILE ${file}: ${(error as Error).message}`);
    }
  }
  const fields = Object.keys(AgentConfig.shape);
  const input: Record<string, unknown> = { ...fromFile };
  for (const field of fields) {
    const value = env[envName(field)];
    if (value !== undefined && value !== '') input[field] = value;
  }
  const parsed = AgentConfig.safeParse(input);
  if (!parsed.success) {
    // zod skips cross-field rules when a field is invalid; list them anyway.
    const issues: { path: PropertyKey[]; message: string }[] = [...parsed.error.issues];
    for (const p of crossFieldProblems(input)) {
      if (!issues.some((i) => i.path[0] === p.path[0] && i.message === p.message)) issues.push(p);
    }
    for (const issue of issues) {
      const field = issue.path[0];
      const where =
        typeof field === 'string' && fields.includes(field) ? `${envName(field)} (${field})` : 'config';
      problems.push(`${where}: ${issue.message}`);
    }
  }
  if (problems.length > 0 || !parsed.success) throw new ConfigError(problems);
  return deepFreeze(parsed.data);
}

function deepFreeze<T>(value: T): Readonly<T> {
  if (typeof value === 'object' && value !== null) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
