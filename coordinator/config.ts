/**
 * The coordinator's configuration, read from the environment (`QP_*`) once in `main.ts`. Defaults live in the
 * schema; every problem is reported at once; the result is frozen (`loadEnvConfig`, core/config/env-config.ts, as the
 * agent's).
 */
import { z } from 'zod';
import { deepFreeze, loadEnvConfig } from '../core/config/env-config.js';
import { RegionName } from '../core/policy/policy.js';
import { hasOwnKey, setOwn } from '../core/own-keys.js';
import { DEFAULT_KV_NAMESPACE, DEFAULT_NATS_TIMEOUT_MS, KvNamespace } from '../core/wire/kv.js';
import type { NatsClientFiles } from './nats/client-options.js';
import {
  ackTimeoutMs,
  defaultLeaseSettings,
  LeaseSettings,
  type LeaseSettingsInput,
} from '../core/lease/settings.js';
import { RebalanceSettings } from '../core/rebalance/settings.js';
import { settingRange } from '../core/config/setting-range.js';
import { grantsFromConfig, type TokenGrant } from './auth/tokens.js';

/** Largest `POST /v1/restore` body by default, bytes (a backup of 1000 policies and 100k audit records fits). */
export const DEFAULT_RESTORE_LIMIT_BYTES = 64 * 1_048_576;

/** Length of the coordinators' leader lease by default, ms: a standby leads within about this long. */
export const DEFAULT_LEADER_LEASE_MS = 10_000;

/** Shortest bearer token accepted: 16 characters (an operator's `openssl rand -hex 16` gives 32). */
export const MIN_TOKEN_LENGTH = 16;

const Token = z
  .string()
  .min(MIN_TOKEN_LENGTH, `tokens must be at least ${MIN_TOKEN_LENGTH} characters`)
  .max(512, 'tokens must be at most 512 characters')
  .regex(/^[\x21-\x7e]+$/, 'tokens are printable ASCII without spaces');

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
/** A protocol setting from the environment: the bounds and default of its core schema (core/lease, core/rebalance). */
const setting = (field: Parameters<typeof settingRange>[0]) => {
  const range = settingRange(field);
  return int(range.min, range.max).default(range.default);
};
const lease = LeaseSettings.shape;
const defaultMaxStep = RebalanceSettings.shape.maxStep.def.defaultValue;

/** A token's name as the audit trail records it. */
export const TokenName = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_.-]{0,63}$/, 'token names are 1-64 chars of a-z 0-9 _ . - starting with a-z 0-9');

/** One named token: `name:role:token`, role `read` or `write`. */
const NamedToken = z
  .string()
  .transform((s, ctx) => {
    const [name, role, ...rest] = s.split(':');
    const token = rest.join(':');
    if (name === undefined || role === undefined || rest.length === 0) {
      ctx.addIssue({ code: 'custom', message: 'named tokens look like name:role:token' });
      return z.NEVER;
    }
    return { name, role, token };
  })
  .pipe(z.object({ name: TokenName, role: z.enum(['read', 'write']), token: Token }));

/** `QP_ADMIN_TOKENS`: named tokens separated by commas or new lines; `#` starts a comment line. */
const NamedTokens = z
  .string()
  .transform((s) =>
    s
      .split(/[\n,]/)
      .map((x) => x.trim())
      .filter((x) => x.length > 0 && !x.startsWith('#')),
  )
  .pipe(z.array(NamedToken).max(256, 'at most 256 named tokens'));

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
    QP_NATS_NKEY_FILE: z.string().min(1).optional(),
    QP_NATS_TLS_CA_FILE: z.string().min(1).optional(),
    QP_REGIONS: z
      .string({ error: 'QP_REGIONS is required, e.g. us,eu,ap' })
      .transform(commaList)
      .pipe(z.array(RegionName).min(1, 'give at least one region').max(64, 'at most 64 regions')),
    QP_ADMIN_TOKEN: Token.optional().describe('bearer token of the write role (named admin)'),
    QP_READ_TOKEN: Token.optional().describe('bearer token of the read role (named reader)'),
    QP_ADMIN_TOKENS: NamedTokens.optional().describe('named tokens: name:role:token,…'),
    QP_METRICS_AUTH: z.enum(['none', 'read']).default('none'),
    QP_METRICS_PORT: int(0, 65535).optional(),
    QP_METRICS_HOST: z.string().min(1).optional(),
    QP_AUDIT_REFUSALS_WINDOW_MS: int(100, 3_600_000).default(10_000),
    QP_AUDIT_REFUSALS_PER_MINUTE: int(0, 100_000).default(60),
    QP_HOST: z.string().min(1).default('127.0.0.1'),
    QP_PORT: int(0, 65535).default(7100),
    QP_LOG_LEVEL: LogLevel.default('info'),
    QP_KV_NAMESPACE: KvNamespace.default(DEFAULT_KV_NAMESPACE),
    QP_NATS_TIMEOUT_MS: int(100, 60_000).default(DEFAULT_NATS_TIMEOUT_MS),
    // Replicas of every bucket and of the audit stream: 3 across three regions' servers survives losing one.
    QP_KV_REPLICAS: int(1, 5).default(1),
    // The leader lease (coordinator/leadership): 0 runs without election (one coordinator, nothing fenced).
    QP_LEADER_LEASE_MS: z.coerce
      .number()
      .int()
      .refine((n) => n === 0 || (n >= 1000 && n <= 600_000), 'QP_LEADER_LEASE_MS is 0 (off) or 1000-600000')
      .default(DEFAULT_LEADER_LEASE_MS),
    QP_COORDINATOR_NAME: z
      .string()
      .regex(/^[A-Za-z0-9_.:-]{1,64}$/, 'coordinator names are 1-64 chars of A-Z a-z 0-9 _ . : -')
      .optional(),
    QP_MAX_POLICIES: int(1, 1_000_000).default(1000),
    QP_BODY_LIMIT_BYTES: int(256, 1_048_576).default(16_384),
    QP_RESTORE_LIMIT_BYTES: int(1024, 1 << 30).default(DEFAULT_RESTORE_LIMIT_BYTES),
    QP_AUDIT_MAX_RECORDS: int(100, 10_000_000).default(100_000),
    QP_AUDIT_MAX_AGE_DAYS: int(1, 3650).default(365),
    QP_AUDIT_MAX_BYTES: int(1_048_576, 1 << 30).default(64 * 1_048_576),
    QP_SHUTDOWN_GRACE_MS: int(0, 60_000).default(0),
    QP_ROUND_MS: setting(RebalanceSettings.shape.roundMs),
    QP_CONFIRM_MS: setting(RebalanceSettings.shape.confirmMs),
    // A fraction of the budget, not a whole number: the bounds and default of its core schema.
    QP_MAX_STEP: z.coerce.number().pipe(RebalanceSettings.shape.maxStep.unwrap()).default(defaultMaxStep),
    QP_REPORT_INTERVAL_MS: setting(lease.reportIntervalMs),
    QP_LEASE_MS: setting(lease.leaseMs),
    QP_GRACE_MS: setting(lease.graceMs),
    QP_SKEW_MS: setting(lease.skewMs),
    QP_MAX_OVERRIDES: setting(lease.maxOverridesPerPolicy),
    QP_OVERRIDE_TTL_MS: setting(lease.overrideTtlMs),
    // Narrower than the schema's (any positive ms): an operator's value below a second or above a week is a slip.
    QP_FORGET_AFTER_MS: int(1000, 7 * 24 * 3_600_000).default(defaultLeaseSettings.forgetAfterMs),
    QP_MAX_AGENTS_PER_REGION: setting(lease.maxAgentsPerRegion),
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
          setOwn(out, region.trim(), value);
        }
        return out;
      }),
  })
  .superRefine((env, ctx) => {
    if (new Set(env.QP_REGIONS).size !== env.QP_REGIONS.length) {
      ctx.addIssue({ code: 'custom', path: ['QP_REGIONS'], message: 'regions must be unique' });
    }
    const settings = LeaseSettings.safeParse(leaseInput(env));
    if (!settings.success) {
      for (const issue of settings.error.issues) {
        ctx.addIssue({ code: 'custom', path: ['QP_LEASE_MS'], message: issue.message });
      }
    } else if (!hasAckTimeout(settings.data, env.QP_ROUND_MS)) {
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
      const missing = env.QP_REGIONS.filter((r) => !hasOwnKey(env.QP_SAFE_SHARES, r));
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
    const grants = tokenGrants(env);
    if (!grants.some((g) => g.principal.role === 'write')) {
      ctx.addIssue({
        code: 'custom',
        path: ['QP_ADMIN_TOKEN'],
        message: 'set QP_ADMIN_TOKEN or a write token in QP_ADMIN_TOKENS',
      });
    }
    const names = grants.map((g) => g.principal.name);
    const dupName = names.find((n, i) => names.indexOf(n) !== i);
    if (dupName !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['QP_ADMIN_TOKENS'],
        message: `token name ${dupName} is used twice (admin and reader name QP_ADMIN_TOKEN and QP_READ_TOKEN)`,
      });
    }
    const tokens = grants.map((g) => g.token);
    // The admin and read tokens equal are reported above; any other secret configured twice is reported here.
    const distinct =
      new Set(tokens).size +
      (env.QP_READ_TOKEN !== undefined && env.QP_READ_TOKEN === env.QP_ADMIN_TOKEN ? 1 : 0);
    if (distinct !== tokens.length) {
      ctx.addIssue({ code: 'custom', path: ['QP_ADMIN_TOKENS'], message: 'every token must differ' });
    }
  });

/** Every configured token with its principal: QP_ADMIN_TOKEN (admin), QP_READ_TOKEN (reader), QP_ADMIN_TOKENS. */
function tokenGrants(env: {
  QP_ADMIN_TOKEN?: string | undefined;
  QP_READ_TOKEN?: string | undefined;
  QP_ADMIN_TOKENS?: readonly { name: string; role: 'read' | 'write'; token: string }[] | undefined;
}): TokenGrant[] {
  return grantsFromConfig(env.QP_ADMIN_TOKEN, env.QP_READ_TOKEN, env.QP_ADMIN_TOKENS);
}

/** The coordinator's settings, as the app and its stores use them. */
export interface CoordinatorConfig {
  /** NATS servers, tried in order. */
  readonly natsServers: readonly string[];
  /** The coordinator's NATS credentials: nkey seed file and TLS CA; anonymous and the system's CAs without. */
  readonly natsAuth?: NatsClientFiles;
  /** Regions the coordinator allocates to, in order. */
  readonly regions: readonly string[];
  /**
   * Every bearer token with its role and name (the name is what the audit trail records): `QP_ADMIN_TOKEN`
   * (write, named admin), `QP_READ_TOKEN` (read, named reader) and the named tokens of `QP_ADMIN_TOKENS`.
   */
  readonly tokens: readonly TokenGrant[];
  /** `/metrics` open to anyone who reaches its listener (`none`) or only with a read or write token. */
  readonly metricsAuth: 'none' | 'read';
  /** Serve `/metrics` on a listener of its own (and not on the admin one); 0 picks a free port. */
  readonly metricsListener: { readonly host: string; readonly port: number } | undefined;
  /** Refused admin requests are recorded in the audit trail: grouped per source and reason per window, capped. */
  readonly auditRefusals: { readonly windowMs: number; readonly perMinute: number };
  readonly host: string;
  readonly port: number;
  readonly logLevel: z.infer<typeof LogLevel>;
  /** Prefix of every JetStream bucket, stream and subject (core/wire/kv.ts). */
  readonly kvNamespace: string;
  /** Deadline of one JetStream request, milliseconds. */
  readonly natsTimeoutMs: number;
  /** Replicas of the buckets and the audit stream (`QP_KV_REPLICAS`); default 1. */
  readonly replicas?: number;
  /**
   * The leader lease (`QP_LEADER_LEASE_MS`, `QP_COORDINATOR_NAME`): a coordinator leads only while it holds it;
   * undefined runs without election.
   */
  readonly leader?: { readonly leaseMs: number; readonly name?: string | undefined } | undefined;
  /** Most policies the store holds; creating one more is refused with COORD_ERR_POLICY_LIMIT. */
  readonly maxPolicies: number;
  /** Largest request body, bytes; larger ones are refused with COORD_ERR_BODY_TOO_LARGE. */
  readonly bodyLimitBytes: number;
  /** Largest `POST /v1/restore` body, bytes (`QP_RESTORE_LIMIT_BYTES`); default DEFAULT_RESTORE_LIMIT_BYTES. */
  readonly restoreLimitBytes?: number;
  /** Audit trail bounds: the oldest records go first when any is reached. */
  readonly audit: { readonly maxRecords: number; readonly maxAgeDays: number; readonly maxBytes: number };
  /** Time between turning not-ready and closing the listener on shutdown, milliseconds. */
  readonly shutdownGraceMs: number;
  /** Settings of the conservation protocol (core/lease, core/rebalance). */
  readonly protocol: {
    readonly rebalance: { readonly roundMs: number; readonly confirmMs?: number; readonly maxStep?: number };
    readonly lease: LeaseSettingsInput;
    readonly safeShares: Readonly<Record<string, number>> | undefined;
  };
}

/** The settings leave agents time to acknowledge a shrink (the rule is ackTimeoutMs's). */
function hasAckTimeout(settings: LeaseSettings, roundMs: number): boolean {
  try {
    ackTimeoutMs(settings, roundMs);
    return true;
  } catch {
    return false;
  }
}

function leaseInput(e: {
  QP_LEASE_MS: number;
  QP_GRACE_MS: number;
  QP_SKEW_MS: number;
  QP_REPORT_INTERVAL_MS: number;
  QP_MAX_OVERRIDES: number;
  QP_OVERRIDE_TTL_MS: number;
  QP_FORGET_AFTER_MS: number;
  QP_MAX_AGENTS_PER_REGION: number;
}): LeaseSettingsInput {
  return {
    leaseMs: e.QP_LEASE_MS,
    graceMs: e.QP_GRACE_MS,
    skewMs: e.QP_SKEW_MS,
    reportIntervalMs: e.QP_REPORT_INTERVAL_MS,
    maxOverridesPerPolicy: e.QP_MAX_OVERRIDES,
    overrideTtlMs: e.QP_OVERRIDE_TTL_MS,
    forgetAfterMs: e.QP_FORGET_AFTER_MS,
    maxAgentsPerRegion: e.QP_MAX_AGENTS_PER_REGION,
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

/**
 * Parse the environment, listing every problem at once, and freeze the result. `QP_ADMIN_TOKENS_FILE` names a file
 * of named tokens, one `name:role:token` a line, added to `QP_ADMIN_TOKENS`; `readFile` is injected (as the
 * agent's `loadConfig` does) so tests need no files.
 */
export function loadConfig(
  env: Readonly<Record<string, string | undefined>>,
  readFile: (path: string) => string = () => {
    throw new Error('no file reader');
  },
): CoordinatorConfig {
  const problems: string[] = [];
  const input: Record<string, string | undefined> = { ...env };
  const file = env['QP_ADMIN_TOKENS_FILE'];
  if (file !== undefined && file !== '') {
    try {
      const text = readFile(file);
      const inline = env['QP_ADMIN_TOKENS'];
      input['QP_ADMIN_TOKENS'] = inline === undefined || inline === '' ? text : `${inline}\n${text}`;
    } catch (error) {
      problems.push(`QP_ADMIN_TOKENS_FILE: cannot read ${file}: ${(error as Error).message}`);
    }
  }
  const e = loadEnvConfig({
    schema: CoordinatorEnv,
    input,
    problems,
    where: (path) => (path.length > 0 ? path.join('.') : 'env'),
    fail: (list) => new ConfigError(list),
  });
  return deepFreeze({
    natsServers: e.QP_NATS_URL,
    natsAuth: { nkeyFile: e.QP_NATS_NKEY_FILE, tlsCaFile: e.QP_NATS_TLS_CA_FILE },
    regions: e.QP_REGIONS,
    tokens: tokenGrants(e),
    metricsAuth: e.QP_METRICS_AUTH,
    metricsListener:
      e.QP_METRICS_PORT === undefined
        ? undefined
        : { host: e.QP_METRICS_HOST ?? e.QP_HOST, port: e.QP_METRICS_PORT },
    auditRefusals: { windowMs: e.QP_AUDIT_REFUSALS_WINDOW_MS, perMinute: e.QP_AUDIT_REFUSALS_PER_MINUTE },
    host: e.QP_HOST,
    port: e.QP_PORT,
    logLevel: e.QP_LOG_LEVEL,
    kvNamespace: e.QP_KV_NAMESPACE,
    natsTimeoutMs: e.QP_NATS_TIMEOUT_MS,
    replicas: e.QP_KV_REPLICAS,
    leader:
      e.QP_LEADER_LEASE_MS === 0 ? undefined : { leaseMs: e.QP_LEADER_LEASE_MS, name: e.QP_COORDINATOR_NAME },
    maxPolicies: e.QP_MAX_POLICIES,
    bodyLimitBytes: e.QP_BODY_LIMIT_BYTES,
    restoreLimitBytes: e.QP_RESTORE_LIMIT_BYTES,
    audit: {
      maxRecords: e.QP_AUDIT_MAX_RECORDS,
      maxAgeDays: e.QP_AUDIT_MAX_AGE_DAYS,
      maxBytes: e.QP_AUDIT_MAX_BYTES,
    },
    shutdownGraceMs: e.QP_SHUTDOWN_GRACE_MS,
    protocol: {
      rebalance: { roundMs: e.QP_ROUND_MS, confirmMs: e.QP_CONFIRM_MS, maxStep: e.QP_MAX_STEP },
      lease: leaseInput(e),
      safeShares: e.QP_SAFE_SHARES,
    },
  });
}
