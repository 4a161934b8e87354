/**
 * The agent's configuration: environment variables (prefix `QP_`) over an optional JSON file
 * (`QP_CONFIG_FILE`), validated once at start by one zod schema that holds every default, with every problem
 * listed at once, and frozen (`loadEnvConfig`, core/config/env-config.ts, as the coordinator's). docs/agent.md has the table.
 */
import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';
import { z } from 'zod';
import { loadEnvConfig } from '../core/config/env-config.js';
import { ownRecord, ownValue, setOwn } from '../core/own-keys.js';
import {
  DEFAULT_BORROW_PLANNER,
  MAX_DRY_MEMORY_LIMIT,
  MAX_LENDERS_LIMIT,
} from '../core/borrowing/planner.js';
import { DEFAULT_LOW_WATER } from '../core/borrowing/borrow.js';
import { RoundTripsText, type RoundTrips } from '../core/distance.js';
import { MAX_LRU_ENTRIES } from '../core/bounded-lru.js';
import {
  DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT,
  MAX_IDEMPOTENCY_RECORDS_PER_SUBJECT,
} from '../core/keys.js';
import { defaultRenewalBounds } from '../core/lease/trust-checks.js';
import { PolicyName, RegionName } from '../core/policy/policy.js';
import { DEFAULT_KV_NAMESPACE, KvNamespace } from '../core/wire/kv.js';
import { RlsRules } from './grpc/descriptor-rules.js';
import { DEFAULT_RATE_LIMIT_DRAFT, RATE_LIMIT_DRAFTS } from '../core/wire/rate-limit-headers.js';
import { DEFAULT_TERM_MS, MAX_TERM_MS, MIN_TERM_MS } from '../core/wire/term.js';

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
      setOwn(out, at < 0 ? part : part.slice(0, at), at < 0 ? undefined : Number(part.slice(at + 1)));
    }
    return out;
  },
  ownRecord(PolicyName, num(0, 1)),
);

const HeaderName = z
  .string()
  .regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/, 'not an HTTP header name')
  .transform((v) => v.toLowerCase());

/** How long a decision may wait for a strict policy's home region by default, ms (`QP_DECISION_DEADLINE_MS`). */
export const DEFAULT_DECISION_DEADLINE_MS = 250;
/** How long a store call may wait for its reply by default, ms (`QP_STORE_TIMEOUT_MS`); every Redis store's default. */
export const DEFAULT_STORE_TIMEOUT_MS = 50;

export const AgentConfig = z
  .strictObject({
    /** Region this agent serves (`us`, `eu-west`). */
    region: RegionName,
    /** One Redis: `redis://host:port/db`. Exactly one of `redisUrl`, `redisClusterNodes` and `redisSentinels`. */
    redisUrl: z.url({ protocol: /^rediss?$/ }).optional(),
    /** Redis Cluster seed nodes, `host:port` each. */
    redisClusterNodes: list.pipe(z.array(ClusterNode).min(1)).optional(),
    /** Redis under Sentinel: the sentinels, `host:port` each; the agent follows the master they name. */
    redisSentinels: list.pipe(z.array(ClusterNode).min(1)).optional(),
    /** Redis under Sentinel: the master's name (`sentinel monitor <name> …`); required with `redisSentinels`. */
    redisMasterName: z
      .string()
      .regex(/^[A-Za-z0-9._-]{1,64}$/, 'a master name is 1-64 letters, digits, dot, dash or underscore')
      .optional(),
    /**
     * Replicas that must hold each decision's write before it is answered (Redis `WAIT` after every script call
     * that charges); 0 does not wait. A failover then forgets no admission the replicas acknowledged
     * (docs/running.md, "Redis high availability"). One Redis or Sentinel only.
     */
    redisWaitReplicas: int(0, 16).default(0),
    /** Longest `WAIT` for `redisWaitReplicas`, ms; fewer acknowledgements by then is a store failure. */
    redisWaitTimeoutMs: int(1, 10_000).default(20),
    /**
     * Longest a decision waits for a strict policy's home region (the forwarded request carries what is left of
     * it) before the policy's failure mode applies with `home_unreachable`.
     */
    decisionDeadlineMs: int(1, 10_000).default(DEFAULT_DECISION_DEADLINE_MS),
    /**
     * Round trips from this region to the others, ms (`us-eu=70,us-ap=150`, core/distance.ts). A check forwarded
     * to a home region may wait `decisionDeadlineMs` plus 1.25 × the round trip to it, its home must charge by
     * the end of that less 1.25 × one way, and a top-up waits for its lenders as long; an unnamed pair counts the
     * round trip this agent has measured to that region (smoothed), 250 ms before its first answer
     * (docs/protocol.md, "Timings at a distance").
     */
    roundTrips: RoundTripsText.default((): RoundTrips => new Map()),
    /**
     * Longest a store call may wait for its reply, measured on the wire from its write (time queued in the agent
     * never counts); the script refuses to run a call later than this, so a late call charges nothing.
     */
    storeTimeoutMs: int(1, 10_000).default(DEFAULT_STORE_TIMEOUT_MS),
    /**
     * Borrowing (with a coordinator): a regional check refused for lack of this region's tokens borrows the
     * subject's own tokens from other regions' buckets, and this agent lends its region's to them, so a subject
     * gets its global budget wherever its traffic is (docs/agent.md, "Borrowing").
     */
    borrowing: bool.default(true),
    /** Top a bucket up from other regions once an admission leaves it below this fraction of its capacity; 0 never. */
    borrowLowWater: num(0, 1).default(DEFAULT_LOW_WATER),
    /** Most regions one borrow round asks, 1..16. */
    borrowMaxLenders: int(1, MAX_LENDERS_LIMIT).default(DEFAULT_BORROW_PLANNER.maxLenders),
    /** Most (policy, subject, lender) entries the borrow planner remembers (LRU), 1..1,000,000. */
    borrowMemory: int(1, MAX_DRY_MEMORY_LIMIT).default(DEFAULT_BORROW_PLANNER.maxEntries),
    /** How long a lender region that did not answer is skipped, for every subject, ms. */
    borrowBackoffMs: int(0, 600_000).default(DEFAULT_BORROW_PLANNER.unreachableBackoffMs),
    /** Most (policy, subject) last refusals kept for `GET /v1/explain` (LRU), 0..1,000,000; 0 keeps none. */
    explainRefusals: int(0, MAX_LRU_ENTRIES).default(10_000),
    /** How concurrent store calls are sent: `batch` (one script call per slot per event-loop turn), `auto` (ioredis auto-pipelining) or `off`. */
    storeBatching: z.enum(['batch', 'auto', 'off']).default('batch'),
    /** Admission control: most decision requests in flight (HTTP and forwarded); beyond it 503 AGT_ERR_OVERLOADED. */
    maxInFlight: int(1, 1_000_000).default(1024),
    /** Admission control: shed while the event loop's delay exceeds this many ms; 0 turns it off. */
    maxEventLoopDelayMs: int(0, 60_000).default(0),
    /** Retry-After of a shed request, in ms (sent in whole seconds, rounded up). */
    overloadRetryAfterMs: int(1, 600_000).default(1000),
    /**
     * Proxies allowed to ask forward-auth (identity, policy and cost headers are believed from them alone) and
     * whose `X-Forwarded-For` names the client. Empty: forward-auth answers nobody.
     */
    trustedProxies: list.pipe(z.array(ProxyRange)).default([]),
    /** Header carrying the subject on `GET /v1/forward-auth`. */
    subjectHeader: HeaderName.default('x-quota-subject'),
    /** When set, forward-auth also requires this shared secret in `forwardAuthSecretHeader` (≥ 16 chars). */
    forwardAuthSecret: z.string().min(16, 'forwardAuthSecret must be at least 16 characters').optional(),
    /** Header carrying the forward-auth shared secret. */
    forwardAuthSecretHeader: HeaderName.default('x-quota-secret'),
    /** Header carrying (and echoing) the request id. */
    requestIdHeader: HeaderName.default('x-request-id'),
    /** When set, subjects are HMAC-hashed before they reach keys and logs (any text up to 1024 chars then). */
    hmacSecret: z.string().min(16, 'hmacSecret must be at least 16 characters').optional(),
    /** A file holding `hmacSecret` (trailing whitespace dropped): what `npm start` and the compose file pass. */
    hmacSecretFile: z.string().min(1).optional(),
    /**
     * Key of the MAC on concurrency lease tokens (≥ 16 chars), the same for every agent of a region. Default:
     * derived from `hmacSecret`; without either, random per process (a lease is released at its own agent).
     */
    leaseTokenSecret: z.string().min(16, 'leaseTokenSecret must be at least 16 characters').optional(),
    /** A file holding `leaseTokenSecret` (trailing whitespace dropped). */
    leaseTokenSecretFile: z.string().min(1).optional(),
    /**
     * NATS servers of the coordinator (comma-separated). When set, policies come from the coordinator's KV bucket,
     * shares from its leases, and strict policies homed elsewhere are forwarded to their home region.
     */
    natsUrl: list.pipe(z.array(z.url({ protocol: /^(nats|tls|wss?)$/ })).min(1)).optional(),
    /** nkey seed file this agent authenticates to NATS with (its region's permissions); anonymous without. */
    natsNkeyFile: z.string().min(1).optional(),
    /** PEM CA bundle trusted for `tls://` NATS servers; the system's CAs without. */
    natsTlsCaFile: z.string().min(1).optional(),
    /** JetStream namespace of the coordinator (its `QP_KV_NAMESPACE`). */
    kvNamespace: KvNamespace.default(DEFAULT_KV_NAMESPACE),
    /**
     * Accept a reload of the coordinator's policies that comes back empty (no policy and no deletion): off by
     * default, the agent keeps its last good policies then (a lost or recreated bucket); policies an operator
     * deleted are dropped either way.
     */
    policiesAcceptEmpty: bool.default(false),
    /** Longest lease a heartbeat reply may grant; a reply asking more is refused (counted, logged). */
    maxLeaseMs: int(100, 3_600_000).default(defaultRenewalBounds.maxLeaseMs),
    /** Longest grace period a heartbeat reply may set; a reply asking more is refused. */
    maxGraceMs: int(100, 7_200_000).default(defaultRenewalBounds.maxGraceMs),
    /**
     * Longest report interval a heartbeat reply may set (the shortest is `defaultRenewalBounds`'
     * minReportIntervalMs, 50 ms); one outside is refused.
     */
    maxReportIntervalMs: int(defaultRenewalBounds.minReportIntervalMs, 600_000).default(
      defaultRenewalBounds.maxReportIntervalMs,
    ),
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
    /** Which draft-ietf-httpapi-ratelimit-headers revision `RateLimit` and `Retry-After` follow. */
    rateLimitHeaders: z.enum(RATE_LIMIT_DRAFTS).default(DEFAULT_RATE_LIMIT_DRAFT),
    /** `POST /v1/terms`: give clients trusted with this region's Redis terms to decide token buckets themselves. */
    // Off by default: a term's usage report is counted as this agent's demand, so only services trusted with the
    // region's budget (and its Redis) should reach the route; an operator turns it on for them.
    terms: z.enum(['on', 'off']).default('off'),
    /** How long a term lasts at most, ms (shorter when the lease in force ends sooner). */
    termMs: int(MIN_TERM_MS, MAX_TERM_MS).default(DEFAULT_TERM_MS),
    host: z.string().min(1).default('127.0.0.1'),
    port: int(0, 65_535).default(7101),
    /** Port of the gRPC rate-limit service (Envoy's RLS); unset: none; 0: any free port. */
    grpcPort: int(0, 65_535).optional(),
    /** Address the gRPC service binds; default `host`. */
    grpcHost: z.string().min(1).optional(),
    /** How descriptors map to policies and subjects (JSON, `{ "rules": [...] }`); default one generic rule. */
    rlsRules: z
      .preprocess((v) => {
        if (typeof v !== 'string') return v;
        try {
          return JSON.parse(v) as unknown;
        } catch {
          return v;
        }
      }, RlsRules)
      .optional(),
    /** A JSON file of `rlsRules`, read once at start. */
    rlsRulesFile: z.string().min(1).optional(),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    /** Fraction of ordinary decisions logged (degraded ones are logged at this rate too, plus breaker changes). */
    logSampleRate: num(0, 1).default(0.01),
    /** Largest request body. */
    bodyLimitBytes: int(256, 1_048_576).default(16_384),
    /** How long an idempotency record answers retries. */
    idempotencyTtlMs: int(1000, 24 * 3600 * 1000).default(3_600_000),
    /** Most live idempotency records one subject keeps; writing one more deletes those closest to expiry. */
    idempotencyMaxRecords: int(1, MAX_IDEMPOTENCY_RECORDS_PER_SUBJECT).default(
      DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT,
    ),
    /** How often the agent sweeps expired reservations (refunding them whole); 0 turns the sweep off. */
    reservationSweepMs: int(0, 600_000).default(1000),
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
    /**
     * Before the agent says ready: batches of 64 dry-run decisions of its own policies through the decision path
     * (startup/warm-up.ts), so the first burst does not pay for the first pass. 0: none.
     */
    warmUpRounds: int(0, 100).default(8),
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
  const targets = [c['redisUrl'], c['redisClusterNodes'], c['redisSentinels']].filter((v) => v !== undefined);
  if (targets.length !== 1) {
    out.push({
      path: ['redisUrl'],
      message: 'set exactly one of QP_REDIS_URL, QP_REDIS_CLUSTER_NODES and QP_REDIS_SENTINELS',
    });
  }
  if ((c['redisSentinels'] === undefined) !== (c['redisMasterName'] === undefined)) {
    out.push({
      path: ['redisMasterName'],
      message: 'QP_REDIS_SENTINELS and QP_REDIS_MASTER_NAME go together',
    });
  }
  if (c['redisClusterNodes'] !== undefined && Number(c['redisWaitReplicas'] ?? 0) > 0) {
    out.push({
      path: ['redisWaitReplicas'],
      message: 'QP_REDIS_WAIT_REPLICAS needs one Redis or Sentinel (a cluster routes WAIT to no slot)',
    });
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
    const value = ownValue(env, envName(field));
    if (value !== undefined && value !== '') setOwn(input, field, value);
  }
  // Fields that may come from a file instead: the file's content, read as the field's value.
  const fromFiles: [file: string, field: string, read: (text: string) => unknown][] = [
    ['rlsRulesFile', 'rlsRules', (text) => JSON.parse(text) as unknown],
    ['hmacSecretFile', 'hmacSecret', (text) => text.trim()],
    ['leaseTokenSecretFile', 'leaseTokenSecret', (text) => text.trim()],
  ];
  for (const [fileField, field, read] of fromFiles) {
    const path = ownValue(input, fileField);
    if (typeof path !== 'string') continue;
    if (ownValue(input, field) !== undefined) {
      problems.push(`${envName(fileField)} and ${envName(field)} exclude each other`);
      continue;
    }
    try {
      setOwn(input, field, read(readFile(path)));
    } catch (error) {
      problems.push(`${envName(fileField)} ${path}: ${(error as Error).message}`);
    }
  }
  return loadEnvConfig({
    schema: AgentConfig,
    input,
    problems,
    crossField: crossFieldProblems,
    where: (path) => {
      const field = path[0];
      const at =
        typeof field === 'string' && fields.includes(field) ? `${envName(field)} (${field})` : 'config';
      const inner = path.slice(1).join('.');
      return `${at}${inner === '' ? '' : ` ${inner}`}`;
    },
    fail: (list) => new ConfigError(list),
  });
}
