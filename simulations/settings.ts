/**
 * Every knob of a simulation run, with its default, as one zod schema: the CLI's `--set`/`--sweep` values are
 * parsed by it, `--help` prints its descriptions, and results.json echoes the parsed object. Precedence:
 * DEFAULT_SETTINGS, then the scenario's defaults, then `--set`, then the swept value.
 */
import { z } from 'zod';
import { FailureMode, MAX_CAPACITY, MAX_REFILL_PER_SECOND } from '../core/policy/policy.js';
import { DEFAULT_LOW_WATER } from '../core/borrowing/borrow.js';
import { DEFAULT_BORROW_PLANNER, MAX_LENDERS_LIMIT } from '../core/borrowing/planner.js';
import { defaultLeaseSettings } from '../core/lease/settings.js';
import { KIND_NAMES, kindOf, type KindName } from '../core/kinds/index.js';
import { defaultRebalanceSettings } from '../core/rebalance/settings.js';
import { DEFAULT_DECISION_DEADLINE_MS, DEFAULT_STORE_TIMEOUT_MS } from '../regional-agent/config.js';

// `--set NAME=VALUE` gives strings: a blank one is no number (Number('') and Number(' ') are 0, which coercion
// took silently), and neither is text Number() cannot read (NaN).
const num = () =>
  z
    .preprocess(
      (v) => (typeof v === 'string' && v.trim() === '' ? Number.NaN : v),
      z.coerce.number({
        error: (issue) =>
          typeof issue.input === 'number' && !Number.isNaN(issue.input)
            ? 'must be a finite number'
            : 'must be a number',
      }),
    )
    .refine(Number.isFinite, 'must be a finite number');
const positive = (max: number) => num().pipe(z.number().positive().max(max));
const nonNegative = (max: number) => num().pipe(z.number().min(0).max(max));
const whole = (min: number, max: number) => num().pipe(z.number().int().min(min).max(max));

/** Region names given to `--regions N`, in order; the first is the strict home unless `homeRegion` says otherwise. */
export const REGION_NAMES = ['us', 'eu', 'ap', 'sa', 'af', 'me', 'oc', 'ca'] as const;

/**
 * The kinds the simulator decides: every registered kind of a store group it has a decision function for (the
 * token-bucket store and the sliding-log store; the daily counters' group has none yet), so a new kind on one of
 * those groups is simulated without being named here.
 */
export const SIMULATED_KINDS = KIND_NAMES.filter((k) => kindOf(k).decidedBy !== 'day') as [
  KindName,
  ...KindName[],
];

export const SettingsObject = z.strictObject({
  durationS: positive(86_400).describe('simulated seconds'),
  capacity: positive(MAX_CAPACITY).describe('policy burst C, tokens'),
  refillPerSecond: positive(MAX_REFILL_PER_SECOND).describe('policy refill R, tokens/s'),
  maxCost: whole(1, 1_000_000).describe('largest request cost, tokens (costs are 1..maxCost)'),
  kind: z
    .enum(SIMULATED_KINDS)
    .optional()
    .describe(
      'policy kind (default token_bucket); sliding_log and concurrency keep capacity C over a window (lease) of C/R s',
    ),
  holdS: positive(86_400)
    .optional()
    .describe(
      'kind concurrency: mean time a client holds an acquired slot before releasing it, s (exponential)',
    ),
  logShare: z
    .enum(['lowest', 'current'])
    .optional()
    .describe(
      "dynamic, log kinds: size a region's limit by its lowest share of the window (the agent's rule) or its current one",
    ),
  onStoreFailure: FailureMode.describe('failure mode when the strict home cannot answer: closed | local'),
  homeRegion: z
    .enum(REGION_NAMES)
    .optional()
    .describe('strict home region, where the coordinator and NATS sit too (default: the first)'),
  load: positive(1_000).describe("demand relative to the policy's budget (scenario-specific meaning)"),
  subjects: whole(1, 100_000).describe('number of regular subjects (tenants)'),
  enterpriseSubjects: whole(0, 100_000)
    .optional()
    .describe(
      'token buckets: the last N of the subjects belong to the policy\'s "enterprise" class (docs/subject-classes.md)',
    ),
  enterpriseFactor: positive(1_000)
    .optional()
    .describe('the enterprise class has enterpriseFactor × C and × R (default 1)'),
  zipfExponent: positive(5).describe('skew of subject popularity in zipf'),
  shiftAtS: nonNegative(86_400).describe('when demand shifts (step-shift, coordinator-crash), s'),
  warmupS: nonNegative(86_400).describe(
    'utilisation and false-denial rates count requests arriving after this, s (over-admission always counts all)',
  ),
  faultAtS: nonNegative(86_400).describe('when the injected failure starts, s'),
  faultForS: positive(86_400).describe('how long a crash or partition lasts, s'),
  standbyAfterS: nonNegative(3600).describe(
    'dynamic: a standby coordinator takes over this long after a crash (its leader lease), s; 0: none, the crashed one returns',
  ),
  failoverLagS: nonNegative(86_400).describe('redis-failover: seconds of writes the promoted replica lost'),
  failoverReset: z
    .enum(['snapshot', 'full'])
    .describe('redis-failover: replica holds an older snapshot, or nothing'),
  homeSplit: z
    .string()
    .regex(/^\d+(\/\d+)*$/, 'homeSplit is weights by region, e.g. 70/20/10')
    .describe("homed-tenants: how subjects' homes spread over the regions, in order (missing regions: none)"),
  quietLoad: positive(1_000).describe('noisy-neighbour: demand of each quiet subject, in units of R'),
  idleAtS: nonNegative(86_400).describe('cold-start: when all demand stops, s'),
  idleForS: positive(86_400).describe('cold-start: how long it stays away before resuming as before, s'),
  oneShotRate: positive(1_000_000).describe('one-shot-identities: new identities per second'),
  retryIntervalMs: positive(3_600_000).describe('ignore-retry-after: ms between a client’s retries'),
  maxRetries: whole(0, 1_000).describe('retries per request before a client gives up'),
  linkDelayMs: nonNegative(10_000).describe('one-way delay between regions, ms'),
  linkJitterMs: nonNegative(10_000).describe('mean exponential jitter added per message, ms'),
  linkLoss: nonNegative(1).describe('probability a message between regions is lost'),
  localDelayMs: nonNegative(10_000).describe('one-way delay inside a region, ms'),
  links: z
    .string()
    .regex(
      /^$|^[a-z]+-[a-z]+=[\d.]+\/[\d.]+\/[\d.]+(,[a-z]+-[a-z]+=[\d.]+\/[\d.]+\/[\d.]+)*$/,
      'links are A-B=delayMs/jitterMs/loss[,…]',
    )
    .describe('per-link overrides, both directions: us-ap=90/10/0.01,eu-ap=120/15/0'),
  forwardTimeoutMs: positive(60_000).describe(
    "a decision's deadline: how long a forwarded (strict) or borrowing (dynamic) decision may wait, ms",
  ),
  storeTimeoutMs: positive(60_000).describe(
    'dynamic with borrowing: time a borrow keeps for the credit and the decision after it, ms',
  ),
  borrowing: z
    .enum(['on', 'off'])
    .describe("dynamic: a subject short of its region's tokens borrows its own from other regions"),
  borrowMaxLenders: whole(1, MAX_LENDERS_LIMIT).describe(
    'dynamic with borrowing: most regions asked per round',
  ),
  borrowLowWater: nonNegative(1).describe(
    'dynamic with borrowing: top a bucket up once an admission leaves it below this fraction (0: never)',
  ),
  borrowBackoffMs: whole(0, 600_000).describe(
    'dynamic with borrowing: how long a lender region that did not answer is skipped, ms',
  ),
  emergencyShare: positive(1).describe(
    "strict with onStoreFailure=local: emergency bucket's share of C and R",
  ),
  overcommit: positive(100).describe(
    'static: each region gets overcommit/N of the budget (1 = conservative)',
  ),
  agentsPerRegion: whole(1, 16).describe('dynamic strategies: agents per region, sharing its Redis'),
  roundMs: whole(50, 60_000).describe('dynamic strategies: rebalance round (interval), ms'),
  reportIntervalMs: whole(50, 60_000).describe('dynamic strategies: heartbeat and usage interval, ms'),
  leaseMs: whole(100, 600_000).describe('dynamic: lease length from the heartbeat that renewed it, ms'),
  graceMs: whole(100, 3_600_000).describe(
    'dynamic: after expiry, min(share, safe) for this long, then the safe share, ms',
  ),
  skewMs: whole(0, 60_000).describe('dynamic: clock-skew margin on lease and floor times, ms'),
  minShare: nonNegative(1).describe("dynamic strategies: floor of a region's share (policy minShare)"),
  hysteresis: nonNegative(0.5).describe('dynamic strategies: smallest target gap that starts a rebalance'),
  damping: num()
    .pipe(z.number().gt(0).max(1))
    .describe('dynamic strategies: fraction of the gap to the target covered per round'),
  maxStep: num()
    .pipe(z.number().gt(0).max(1))
    .describe("dynamic strategies: largest change of a region's share in one step"),
  confirmMs: whole(0, 600_000).describe(
    'dynamic strategies: the target must stay beyond the hysteresis band this long before a move, ms',
  ),
  unmetFraction: nonNegative(1).describe(
    'dynamic strategies: a move starts only if a growing region lacks this fraction of its demand (refused or borrowed)',
  ),
  demandHalfLifeMs: whole(1, 600_000).describe('dynamic strategies: half-life of smoothed demand, ms'),
  maxOverrides: whole(0, 1024).describe('dynamic: most per-subject overrides of the policy'),
  convergenceTolerance: positive(1).describe('convergence: admitted within this fraction of ideal'),
  convergenceWindowS: whole(1, 3_600).describe('convergence: seconds of admissions compared at a time'),
  convergenceHoldS: whole(0, 86_400).describe('convergence: seconds that must remain after it to count'),
  binS: whole(1, 3_600).describe('chart and convergence bin, s'),
});

/** A complete, validated set of settings. */
export const Settings = SettingsObject.superRefine((s, ctx) => {
  if (s.maxCost > s.capacity)
    ctx.addIssue({ code: 'custom', path: ['maxCost'], message: 'maxCost must be ≤ capacity' });
  if (s.onStoreFailure === 'open')
    ctx.addIssue({
      code: 'custom',
      path: ['onStoreFailure'],
      message: 'the simulated policy guards strict decisions, which may not fail open: use closed or local',
    });
  if (s.kind !== undefined && kindOf(s.kind).window !== undefined && logWindowOf(s) === undefined)
    ctx.addIssue({
      code: 'custom',
      path: ['refillPerSecond'],
      message: `kind ${s.kind} keeps capacity over a window of capacity / refillPerSecond seconds, which must be a whole number (here ${s.capacity / s.refillPerSecond})`,
    });
  if ((s.enterpriseSubjects ?? 0) > s.subjects)
    ctx.addIssue({
      code: 'custom',
      path: ['enterpriseSubjects'],
      message: `enterpriseSubjects (${s.enterpriseSubjects}) must be ≤ subjects (${s.subjects})`,
    });
  if ((s.enterpriseSubjects ?? 0) > 0 && s.kind !== undefined && s.kind !== 'token_bucket')
    ctx.addIssue({
      code: 'custom',
      path: ['enterpriseSubjects'],
      message: 'subject classes are simulated for token buckets: run it with kind token_bucket',
    });
  if (s.kind !== undefined && kindOf(s.kind).leases && s.holdS === undefined)
    ctx.addIssue({
      code: 'custom',
      path: ['holdS'],
      message: 'kind concurrency needs holdS, the mean time a client holds its slot',
    });
});
export type Settings = z.output<typeof Settings>;

/**
 * The window of a log kind (a sliding log's `windowSeconds`, a concurrency policy's `leaseSeconds`): C / R, so a
 * log policy has the capacity and long-run rate of the token bucket it replaces. Undefined for token buckets or
 * when C / R is not a whole number of seconds (refused by `Settings`).
 */
export function logWindowOf(s: Pick<Settings, 'kind' | 'capacity' | 'refillPerSecond'>): number | undefined {
  if (s.kind === undefined || kindOf(s.kind).window === undefined) return undefined;
  const exact = s.capacity / s.refillPerSecond;
  const window = Math.round(exact);
  return window >= 1 && Math.abs(exact - window) <= 1e-9 * window ? window : undefined;
}
/** The name of one setting. */
export type SettingName = keyof Settings;

/** Defaults every scenario starts from. */
export const DEFAULT_SETTINGS: Settings = {
  durationS: 300,
  capacity: 100,
  refillPerSecond: 2,
  maxCost: 1,
  kind: undefined,
  holdS: undefined,
  logShare: undefined,
  onStoreFailure: 'closed',
  homeRegion: undefined,
  load: 2,
  subjects: 10,
  enterpriseSubjects: undefined,
  enterpriseFactor: undefined,
  zipfExponent: 1.1,
  shiftAtS: 150,
  warmupS: 0,
  faultAtS: 120,
  faultForS: 60,
  standbyAfterS: 0,
  failoverLagS: 5,
  failoverReset: 'snapshot',
  homeSplit: '70/20/10',
  quietLoad: 0.5,
  idleAtS: 60,
  idleForS: 30,
  oneShotRate: 200,
  retryIntervalMs: 50,
  maxRetries: 20,
  linkDelayMs: 40,
  linkJitterMs: 5,
  linkLoss: 0,
  localDelayMs: 0.25,
  links: '',
  forwardTimeoutMs: DEFAULT_DECISION_DEADLINE_MS,
  storeTimeoutMs: DEFAULT_STORE_TIMEOUT_MS,
  borrowing: 'on',
  borrowMaxLenders: DEFAULT_BORROW_PLANNER.maxLenders,
  borrowLowWater: DEFAULT_LOW_WATER,
  borrowBackoffMs: DEFAULT_BORROW_PLANNER.unreachableBackoffMs,
  emergencyShare: 0.05,
  overcommit: 1,
  agentsPerRegion: 1,
  roundMs: defaultRebalanceSettings.roundMs,
  reportIntervalMs: defaultLeaseSettings.reportIntervalMs,
  leaseMs: defaultLeaseSettings.leaseMs,
  graceMs: defaultLeaseSettings.graceMs,
  skewMs: defaultLeaseSettings.skewMs,
  minShare: defaultRebalanceSettings.defaultMinShare,
  hysteresis: defaultRebalanceSettings.hysteresis,
  damping: defaultRebalanceSettings.damping,
  maxStep: defaultRebalanceSettings.maxStep,
  confirmMs: defaultRebalanceSettings.confirmMs,
  unmetFraction: defaultRebalanceSettings.unmetFraction,
  demandHalfLifeMs: defaultRebalanceSettings.demandHalfLifeMs,
  maxOverrides: defaultLeaseSettings.maxOverridesPerPolicy,
  convergenceTolerance: 0.1,
  convergenceWindowS: 5,
  convergenceHoldS: 30,
  binS: 1,
};

/** Names of every setting, in schema order. */
export const SETTING_NAMES = Object.keys(SettingsObject.shape) as SettingName[];

export function isSettingName(name: string): name is SettingName {
  return Object.hasOwn(SettingsObject.shape, name);
}

/** Layer raw overrides (strings from the CLI, or values) over `base` and validate the whole. */
export function resolveSettings(
  base: Settings,
  ...layers: readonly Readonly<Record<string, unknown>>[]
): Settings {
  return Settings.parse(Object.assign({}, base, ...layers));
}

/** One line per setting for `--help`: name, default, description. */
export function describeSettings(): string[] {
  return SETTING_NAMES.map((name) => {
    const value = DEFAULT_SETTINGS[name];
    const shown = value === undefined || value === '' ? '-' : String(value);
    return `  ${name.padEnd(22)} ${shown.padEnd(9)} ${SettingsObject.shape[name].description ?? ''}`;
  });
}
