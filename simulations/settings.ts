/**
 * Every knob of a simulation run, with its default, as one zod schema: the CLI's `--set`/`--sweep` values are
 * parsed by it, `--help` prints its descriptions, and results.json echoes the parsed object. Precedence:
 * DEFAULT_SETTINGS, then the scenario's defaults, then `--set`, then the swept value.
 */
import { z } from 'zod';
import { FailureMode, MAX_CAPACITY, MAX_REFILL_PER_SECOND } from '../core/policy.js';

const num = () => z.coerce.number().refine(Number.isFinite, 'must be a finite number');
const positive = (max: number) => num().pipe(z.number().positive().max(max));
const nonNegative = (max: number) => num().pipe(z.number().min(0).max(max));
const whole = (min: number, max: number) => num().pipe(z.number().int().min(min).max(max));

/** Region names given to `--regions N`, in order; the first is the strict home unless `homeRegion` says otherwise. */
export const REGION_NAMES = ['us', 'eu', 'ap', 'sa', 'af', 'me', 'oc', 'ca'] as const;

export const SettingsObject = z.strictObject({
  durationS: positive(86_400).describe('simulated seconds'),
  capacity: positive(MAX_CAPACITY).describe('policy burst C, tokens'),
  refillPerSecond: positive(MAX_REFILL_PER_SECOND).describe('policy refill R, tokens/s'),
  maxCost: whole(1, 1_000_000).describe('largest request cost, tokens (costs are 1..maxCost)'),
  onStoreFailure: FailureMode.describe('failure mode when the strict home cannot answer: closed | local'),
  homeRegion: z
    .enum(REGION_NAMES)
    .optional()
    .describe('strict home region, where the coordinator and NATS sit too (default: the first)'),
  load: positive(1_000).describe("demand relative to the policy's budget (scenario-specific meaning)"),
  subjects: whole(1, 100_000).describe('number of regular subjects (tenants)'),
  zipfExponent: positive(5).describe('skew of subject popularity in zipf'),
  shiftAtS: nonNegative(86_400).describe('when demand shifts (step-shift, coordinator-crash), s'),
  warmupS: nonNegative(86_400).describe(
    'utilisation and false-denial rates count requests arriving after this, s (over-admission always counts all)',
  ),
  faultAtS: nonNegative(86_400).describe('when the injected failure starts, s'),
  faultForS: positive(86_400).describe('how long a crash or partition lasts, s'),
  failoverLagS: nonNegative(86_400).describe('redis-failover: seconds of writes the promoted replica lost'),
  failoverReset: z
    .enum(['snapshot', 'full'])
    .describe('redis-failover: replica holds an older snapshot, or nothing'),
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
  forwardTimeoutMs: positive(60_000).describe('strict: how long a forwarded decision may take'),
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
});
export type Settings = z.output<typeof Settings>;
/** The name of one setting. */
export type SettingName = keyof Settings;

/** Defaults every scenario starts from. */
export const DEFAULT_SETTINGS: Settings = {
  durationS: 300,
  capacity: 100,
  refillPerSecond: 2,
  maxCost: 1,
  onStoreFailure: 'closed',
  homeRegion: undefined,
  load: 2,
  subjects: 10,
  zipfExponent: 1.1,
  shiftAtS: 150,
  warmupS: 0,
  faultAtS: 120,
  faultForS: 60,
  failoverLagS: 5,
  failoverReset: 'snapshot',
  oneShotRate: 200,
  retryIntervalMs: 50,
  maxRetries: 20,
  linkDelayMs: 40,
  linkJitterMs: 5,
  linkLoss: 0,
  localDelayMs: 0.25,
  links: '',
  forwardTimeoutMs: 250,
  emergencyShare: 0.05,
  overcommit: 1,
  agentsPerRegion: 1,
  roundMs: 1000,
  reportIntervalMs: 1000,
  leaseMs: 6000,
  graceMs: 12_000,
  skewMs: 1000,
  minShare: 0.02,
  hysteresis: 0.08,
  damping: 0.85,
  demandHalfLifeMs: 2000,
  maxOverrides: 16,
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
