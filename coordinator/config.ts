/**
 * The coordinator's configuration, read from the environment (`QP_*`) once in `main.ts`. Defaults live in the
 * schema; every problem is reported at once; the result is frozen.
 */
import { z } from 'zod';
import { RegionName } from '../core/policy.js';
import { DEFAULT_KV_NAMESPACE, KvNamespace } from '../core/wire/kv.js';
import { LeaseSettings, type LeaseSettingsInput } from '../core/lease/settings.js';

/** Shortest bearer token accepted: 16 characters (an operator's `openssl rand -hex 16` gives 32). */
export const MIN_TOKEN_LENGTH = 16;

const Token = z
  .string()
  .min(MIN_TOKEN_LENGTH, `tokens must be at least ${MIN_TOKEN_LENGTH} characters`)
  .max(512, 'tokens must be at most 512 characters')
  .regex(/^[\x21-\x7e]+$/, 'tokens are printable ASCII without spaces');

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);

const commaList = (s: string): string[] =>
  s
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x.length > 0);

const LogLevel = z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']);

/** Environment variables the coordinator reads, with their defaults. */
export const CoordinatorEnv = z
  .object({
    QP_NATS_URL: z
      .string()
      .default('nats://127.0.0.1:4222')
      .transform(commaList)
      .pipe(
        z
          .array(z.url({ protocol: /^(nats|tls|wss?)$/, error: 'NATS URLs look like nats://host:port' }))
          .min(1, 'give at least one NATS URL'),
      ),
    QP_REGIONS: z
      .string({ error: 'QP_REGIONS is required, e.g. us,eu,ap' })
      .transform(commaList)
      .pipe(z.array(RegionName).min(1, 'give at least one region').max(64, 'at most 64 regions')),
    QP_ADMIN_TOKEN: Token.describe('bearer token of the write role'),
    QP_READ_TOKEN: Token.optional().describe('bearer token of the read role'),
    QP_HOST: z.string().min(1).default('127.0.0.1'),
    QP_PORT: int(0, 65535).default(7100),
    QP_LOG_LEVEL: LogLevel.default('info'),
    QP_KV_NAMESPACE: KvNamespace.default(DEFAULT_KV_NAMESPACE),
    QP_NATS_TIMEOUT_MS: int(100, 60_000).default(2000),
    QP_MAX_POLICIES: int(1, 1_000_000).default(1000),
    QP_BODY_LIMIT_BYTES: int(256, 1_048_576).default(16_384),
    QP_AUDIT_MAX_RECORDS: int(100, 10_000_000).default(100_000),
    QP_AUDIT_MAX_AGE_DAYS: int(1, 3650).default(365),
    QP_AUDIT_MAX_BYTES: int(1_048_576, 1 << 30).default(64 * 1_048_576),
    QP_SHUTDOWN_GRACE_MS: int(0, 60_000).default(0),
    QP_ROUND_MS: int(50, 60_000).default(1000),
    QP_REPORT_INTERVAL_MS: int(50, 60_000).default(1000),
    QP_LEASE_MS: int(100, 600_000).default(6000),
    QP_GRACE_MS: int(100, 3_600_000).default(12_000),
    QP_SKEW_MS: int(0, 60_000).default(1000),
    QP_MAX_OVERRIDES: int(0, 1024).default(16),
    QP_OVERRIDE_TTL_MS: int(1000, 3_600_000).default(30_000),
    QP_SAFE_SHARES: z
      .string()
      .optional()
      .transform((s, ctx) => {
        if (s === undefined || s.trim() === '') return undefined;
        const out: Record<string, number> = {};
        for (const part of commaList(s)) {
          const [region, share] = part.split('=');
          const value = Number(share);
          if (region === undefined || share === undefined || !(value >= 0 && value <= 1)) {
            ctx.addIssue({
              code: 'custom',
              message: `safe shares look like us=0.4,eu=0.3,ap=0.3 (got "${part}")`,
            });
            return z.NEVER;
          }
          out[region.trim()] = value;
        }
        return out;
      }),
  })
  .superRefine((env, ctx) => {
    if (new Set(env.QP_REGIONS).size !== env.QP_REGIONS.length) {
      ctx.addIssue({ code: 'custom', path: ['QP_REGIONS'], message: 'regions must be unique' });
    }
    const lease = LeaseSettings.safeParse(leaseInput(env));
    if (!lease.success) {
      for (const issue of lease.error.issues) {
        ctx.addIssue({ code: 'custom', path: ['QP_LEASE_MS'], message: issue.message });
      }
    } else if (lease.data.graceMs <= lease.data.leaseMs + 2 * lease.data.skewMs + env.QP_ROUND_MS) {
      ctx.addIssue({
        code: 'custom',
        path: ['QP_GRACE_MS'],
        message: 'QP_GRACE_MS must exceed QP_LEASE_MS + 2 × QP_SKEW_MS + QP_ROUND_MS',
      });
    }
    if (env.QP_SAFE_SHARES !== undefined) {
      const unknown = Object.keys(env.QP_SAFE_SHARES).filter((r) => !env.QP_REGIONS.includes(r));
      if (unknown.length > 0) {
        ctx.addIssue({
          code: 'custom',
          path: ['QP_SAFE_SHARES'],
          message: `unknown regions: ${unknown.join(', ')}`,
        });
      }
      const missing = env.QP_REGIONS.filter((r) => env.QP_SAFE_SHARES?.[r] === undefined);
      if (missing.length > 0) {
        ctx.addIssue({
          code: 'custom',
          path: ['QP_SAFE_SHARES'],
          message: `missing regions: ${missing.join(', ')}`,
        });
      }
      const sum = Object.values(env.QP_SAFE_SHARES).reduce((a, b) => a + b, 0);
      if (sum > 1 + 1e-9) {
        ctx.addIssue({
          code: 'custom',
          path: ['QP_SAFE_SHARES'],
          message: `safe shares sum to ${sum}, above 1`,
        });
      }
    }
    if (env.QP_READ_TOKEN !== undefined && env.QP_READ_TOKEN === env.QP_ADMIN_TOKEN) {
      ctx.addIssue({
        code: 'custom',
        path: ['QP_READ_TOKEN'],
        message: 'the read token must differ from the admin token',
      });
    }
  });

/** The coordinator's settings, as the app and its stores use them. */
export interface CoordinatorConfig {
  /** NATS servers, tried in order. */
  readonly natsServers: readonly string[];
  /** Regions the coordinator allocates to, in order. */
  readonly regions: readonly string[];
  /** Bearer token of the write role (it may read as well). */
  readonly adminToken: string;
  /** Bearer token of the read role; none configured means only the admin token works. */
  readonly readToken: string | undefined;
  readonly host: string;
  readonly port: number;
  readonly logLevel: z.infer<typeof LogLevel>;
  /** Prefix of every JetStream bucket, stream and subject (core/wire/kv.ts). */
  readonly kvNamespace: string;
  /** Deadline of one JetStream request, milliseconds. */
  readonly natsTimeoutMs: number;
  /** Most policies the store holds; creating one more is refused with COORD_ERR_POLICY_LIMIT. */
  readonly maxPolicies: number;
  /** Largest request body, bytes; larger ones are refused with COORD_ERR_BODY_TOO_LARGE. */
  readonly bodyLimitBytes: number;
  /** Audit trail bounds: the oldest records go first when any is reached. */
  readonly audit: { readonly maxRecords: number; readonly maxAgeDays: number; readonly maxBytes: number };
  /** Time between turning not-ready and closing the listener on shutdown, milliseconds. */
  readonly shutdownGraceMs: number;
  /** Settings of the conservation protocol (core/lease, core/rebalance). */
  readonly protocol: {
    readonly rebalance: { readonly roundMs: number };
    readonly lease: LeaseSettingsInput;
    readonly safeShares: Readonly<Record<string, number>> | undefined;
  };
}

function leaseInput(e: {
  QP_LEASE_MS: number;
  QP_GRACE_MS: number;
  QP_SKEW_MS: number;
  QP_REPORT_INTERVAL_MS: number;
  QP_MAX_OVERRIDES: number;
  QP_OVERRIDE_TTL_MS: number;
}): LeaseSettingsInput {
  return {
    leaseMs: e.QP_LEASE_MS,
    graceMs: e.QP_GRACE_MS,
    skewMs: e.QP_SKEW_MS,
    reportIntervalMs: e.QP_REPORT_INTERVAL_MS,
    maxOverridesPerPolicy: e.QP_MAX_OVERRIDES,
    overrideTtlMs: e.QP_OVERRIDE_TTL_MS,
  };
}

/** Thrown by `loadConfig`: one line per problem. */
export class ConfigError extends Error {
  readonly code = 'COORD_ERR_CONFIG';
  readonly problems: readonly string[];

  constructor(problems: readonly string[]) {
    super(`invalid coordinator configuration:\n  ${problems.join('\n  ')}`);
    this.name = 'ConfigError';
    this.problems = problems;
  }
}

/** Parse the environment, listing every problem at once, and freeze the result. */
export function loadConfig(env: Readonly<Record<string, string | undefined>>): CoordinatorConfig {
  const parsed = CoordinatorEnv.safeParse(env);
  if (!parsed.success) {
    throw new ConfigError(
      parsed.error.issues.map((i) => `${i.path.length > 0 ? i.path.join('.') : 'env'}: ${i.message}`),
    );
  }
  const e = parsed.data;
  return deepFreeze({
    natsServers: e.QP_NATS_URL,
    regions: e.QP_REGIONS,
    adminToken: e.QP_ADMIN_TOKEN,
    readToken: e.QP_READ_TOKEN,
    host: e.QP_HOST,
    port: e.QP_PORT,
    logLevel: e.QP_LOG_LEVEL,
    kvNamespace: e.QP_KV_NAMESPACE,
    natsTimeoutMs: e.QP_NATS_TIMEOUT_MS,
    maxPolicies: e.QP_MAX_POLICIES,
    bodyLimitBytes: e.QP_BODY_LIMIT_BYTES,
    audit: {
      maxRecords: e.QP_AUDIT_MAX_RECORDS,
      maxAgeDays: e.QP_AUDIT_MAX_AGE_DAYS,
      maxBytes: e.QP_AUDIT_MAX_BYTES,
    },
    shutdownGraceMs: e.QP_SHUTDOWN_GRACE_MS,
    protocol: {
      rebalance: { roundMs: e.QP_ROUND_MS },
      lease: leaseInput(e),
      safeShares: e.QP_SAFE_SHARES,
    },
  });
}

function deepFreeze<T extends object>(o: T): T {
  for (const v of Object.values(o)) if (typeof v === 'object' && v !== null) deepFreeze(v as object);
  return Object.freeze(o);
}
