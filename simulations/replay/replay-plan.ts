/**
 * What a real-stack replay will do, decided before anything starts: which scenarios and strategies it supports
 * (and why not the others), the stack's timing for a compression K, the policy it creates for each strategy, and
 * the settings the simulator predicts with, so the prediction runs on exactly what the stack enforces. Pure: no
 * I/O, every problem a SimConfigError listing all of them.
 *
 * Compression K: one second of the scenario is 1/K s of wall time. Arrival times and every protocol timer are
 * divided by K, the policy's refill is multiplied by K and its capacity kept, so C + R·W over a scenario window W
 * is the same number of tokens as C + (R·K)·(W/K) over the compressed window.
 */
import { AgentConfig, DEFAULT_DECISION_DEADLINE_MS } from '../../regional-agent/config.js';
import { ZodError } from 'zod';
import { defaultLeaseSettings, LeaseSettings } from '../../core/lease/settings.js';
import { PolicySpec, type PolicyMode, type PolicySpecInput } from '../../core/policy/policy.js';
import { hasOwnKey, ownValue } from '../../core/own-keys.js';
import { defaultRebalanceSettings, RebalanceSettings } from '../../core/rebalance/settings.js';
import { settingRange } from '../../core/config/setting-range.js';
import {
  farthestRoundTrip,
  formatRoundTrips,
  linkAllowanceMs,
  missingPairs,
  parseRoundTrips,
  roundTripOf,
  type RoundTrips,
} from '../../core/distance.js';
import { STACK_REGIONS } from '../../scripts/stack/config.js';
import { regionsOf, simPolicy, validateRun, type RunSpec } from '../engine/run.js';
import { SimConfigError } from '../errors.js';
import type { Scenario } from '../scenario.js';
import { resolveSettings, type SettingName, type Settings } from '../settings.js';
import { planRuns, type SimulateOptions } from '../simulate.js';
import type { StrategyDefinition } from '../strategy.js';
import { ideal } from '../strategies/ideal.js';

/** Default compression: the simulator's default 300 s scenario becomes 30 s of wall time. */
export const DEFAULT_COMPRESSION = 10;
/**
 * Default compression with `--geo`: the largest K whose report interval (1000 ms / K of wall time) still carries a
 * heartbeat and its renewal across the default matrix's longest link with the margin every wait gets
 * (`linkAllowanceMs`: 1.25 × 220 = 275 ms). 150 s of scenario take 50 s of wall time.
 */
export const DEFAULT_GEO_COMPRESSION = 3;
/** Largest compression the CLI accepts (the protocol's minimum timers refuse most values above 20 anyway). */
export const MAX_COMPRESSION = 100;
/** Longest replay of one strategy, wall seconds: a replay is a check, not a soak test. */
export const MAX_WALL_SECONDS = 300;
/** Highest mean request rate a replay may ask of the loopback stack, requests per wall second. */
export const MAX_WALL_RATE = 1500;

/** Scenarios the replay refuses, and why. */
export const UNSUPPORTED_SCENARIOS: Readonly<Record<string, string>> = {
  'coordinator-crash':
    'the stack launcher stops every process when one of them dies, so it cannot crash and restart the coordinator alone',
  'region-partition':
    'the agents reach NATS directly on loopback; cutting one region off needs a proxy the launcher does not put in between',
  'ignore-retry-after':
    'client retries depend on the real answers, while the replay sends a list of arrivals fixed in advance (open loop)',
};

/** Strategies the stack can enforce, by the policy mode that does it. */
export const REPLAY_MODES: Readonly<Record<string, PolicyMode>> = {
  dynamic: 'regional',
  strict: 'strict',
  independent: 'local',
};

const UNSUPPORTED_STRATEGIES: Readonly<Record<string, string>> = {
  static:
    'the coordinator moves the shares of every regional policy; a fixed split has no counterpart on the stack',
  'naive-dynamic':
    'it exists in the simulator only (the rebalancer without the two-phase protocol, for comparison)',
};

/** Protocol timers the stack takes from its environment, with the bounds the coordinator (or agent) accepts. */
const TIMERS = [
  { setting: 'roundMs', env: 'QP_COORDINATOR_ROUND_MS', ...settingRange(RebalanceSettings.shape.roundMs) },
  {
    setting: 'reportIntervalMs',
    env: 'QP_COORDINATOR_REPORT_INTERVAL_MS',
    ...settingRange(LeaseSettings.shape.reportIntervalMs),
  },
  { setting: 'leaseMs', env: 'QP_COORDINATOR_LEASE_MS', ...settingRange(LeaseSettings.shape.leaseMs) },
  { setting: 'graceMs', env: 'QP_COORDINATOR_GRACE_MS', ...settingRange(LeaseSettings.shape.graceMs) },
  { setting: 'skewMs', env: 'QP_COORDINATOR_SKEW_MS', ...settingRange(LeaseSettings.shape.skewMs) },
  {
    setting: 'forwardTimeoutMs',
    env: 'QP_AGENT_DECISION_DEADLINE_MS',
    ...settingRange(AgentConfig.shape.decisionDeadlineMs),
  },
  {
    setting: 'confirmMs',
    env: 'QP_COORDINATOR_CONFIRM_MS',
    ...settingRange(RebalanceSettings.shape.confirmMs),
  },
] as const satisfies readonly { setting: SettingName; env: string; min: number; max: number }[];
/** The shortest override TTL the coordinator takes, ms. */
const MIN_OVERRIDE_TTL_MS = settingRange(LeaseSettings.shape.overrideTtlMs).min;

/** Variables the replay sets on the stack itself; the caller's environment may not set them. */
export const REPLAY_STACK_VARS: readonly string[] = [
  ...TIMERS.map((t) => t.env),
  'QP_COORDINATOR_MAX_OVERRIDES',
  'QP_COORDINATOR_OVERRIDE_TTL_MS',
  // The topology decides the links the prediction models: loopback, or --geo's matrix.
  'QP_STACK_TOPOLOGY',
  'QP_STACK_ROUND_TRIPS',
  'QP_STACK_LINK_JITTER',
  'QP_AGENT_ROUND_TRIPS',
];

/** Settings `--geo` fixes from its round-trip matrix. */
const LINK_SETTINGS: readonly SettingName[] = ['linkDelayMs', 'linkJitterMs', 'linkLoss', 'links'];

/**
 * The simulator's links for the geo topology's matrix at compression K: each pair one way at half its round trip
 * times K, no loss, and no added jitter (the stack's links jitter ±10 % around the same delay, so the mean is
 * the same). `us-eu=350/0/0,…` at K = 10 for the default matrix.
 */
export function geoLinks(roundTrips: RoundTrips, regions: readonly string[], compression: number): string {
  const out: string[] = [];
  regions.forEach((a, i) => {
    for (const b of regions.slice(i + 1)) {
      const rtt = roundTripOf(roundTrips, a, b)!;
      out.push(`${a}-${b}=${(rtt / 2) * compression}/0/0`);
    }
  });
  return out.join(',');
}

/** Settings the stack cannot take: loopback has no link delay, and one agent runs per region. */
const FIXED_BY_STACK: readonly { setting: SettingName; value: number | string; why: string }[] = [
  { setting: 'linkDelayMs', value: 0, why: 'the stack runs on loopback' },
  { setting: 'linkJitterMs', value: 0, why: 'the stack runs on loopback' },
  { setting: 'linkLoss', value: 0, why: 'the stack runs on loopback' },
  { setting: 'links', value: '', why: 'the stack runs on loopback' },
  { setting: 'agentsPerRegion', value: 1, why: 'the launcher runs one agent per region' },
  {
    setting: 'damping',
    value: defaultRebalanceSettings.damping,
    why: 'the coordinator takes no setting for it',
  },
  {
    setting: 'hysteresis',
    value: defaultRebalanceSettings.hysteresis,
    why: 'the coordinator takes no setting for it',
  },
];

export interface ReplayOptions extends SimulateOptions {
  /** K: scenario seconds per wall second. */
  compression: number;
  /** `--geo`: the stack's geo topology, regions `roundTrips` apart (wall ms, `us-eu=70,…`). */
  geo?: { roundTrips: string } | undefined;
}

/** Timers of the stack, wall milliseconds. */
export interface WallTiming {
  roundMs: number;
  reportIntervalMs: number;
  leaseMs: number;
  graceMs: number;
  skewMs: number;
  overrideTtlMs: number;
  /** The agents' decision deadline (strict forwarding included). */
  decisionDeadlineMs: number;
}

/** One strategy replayed on the stack. */
export interface ReplayTarget {
  strategy: StrategyDefinition;
  /** The body of `PUT /v1/policies/{name}`: the simulated policy, compressed. */
  policy: PolicySpecInput;
}

export interface ReplayPlan {
  scenario: Scenario;
  seed: number;
  compression: number;
  regions: string[];
  /** Settings in scenario time, as the stack enforces them: what the prediction and the real rows echo. */
  settings: Settings;
  wall: WallTiming;
  /** `QP_COORDINATOR_*` and `QP_AGENT_*` variables for the launcher. */
  stackEnv: Record<string, string>;
  targets: ReplayTarget[];
  /** The simulator's runs: ideal, then each replayed strategy, on `settings`. */
  predictions: RunSpec[];
  /** `--geo`: the stack's round trips, wall ms (`us-eu=70,…`); undefined on loopback. */
  roundTrips: string | undefined;
}

const issues = (error: ZodError) =>
  error.issues.map((i) => `${i.path.join('.') || 'settings'}: ${i.message}`).join('; ');

/** Check the options and work out the plan; throws SimConfigError naming every problem. */
export function planReplay(o: ReplayOptions): ReplayPlan {
  const problems: string[] = [];
  const K = o.compression;
  if (!(Number.isInteger(K) && K >= 1 && K <= MAX_COMPRESSION))
    throw new SimConfigError(`--compress must be an integer in [1, ${MAX_COMPRESSION}], got ${K}`);
  if (o.scenarios.length !== 1)
    throw new SimConfigError('--real-stack replays one scenario at a time (give one --scenario)');
  if (o.sweep !== undefined) throw new SimConfigError('--real-stack does not sweep: drop --sweep');
  const scenario = o.scenarios[0]!;
  const unsupported = ownValue(UNSUPPORTED_SCENARIOS, scenario.name);
  if (unsupported !== undefined) problems.push(`--real-stack cannot replay ${scenario.name}: ${unsupported}`);
  const regions = regionsOf(o.regionCount);
  if (regions.join(',') !== STACK_REGIONS.join(','))
    problems.push(
      `--real-stack runs the stack's ${STACK_REGIONS.length} regions (${STACK_REGIONS.join(', ')}): use --regions 3`,
    );

  const strategies = o.strategies.filter((s) => s.name !== ideal.name);
  if (strategies.length === 0)
    problems.push(
      `--real-stack needs a strategy the stack enforces: ${Object.keys(REPLAY_MODES).join(', ')}`,
    );
  for (const s of strategies) {
    if (hasOwnKey(REPLAY_MODES, s.name)) continue;
    const why = ownValue(UNSUPPORTED_STRATEGIES, s.name) ?? 'the stack has no counterpart';
    problems.push(
      `--real-stack cannot replay ${s.name}: ${why} (replayable: ${Object.keys(REPLAY_MODES).join(', ')})`,
    );
  }

  let roundTrips: RoundTrips | undefined;
  if (o.geo !== undefined) {
    const parsed = parseRoundTrips(o.geo.roundTrips, STACK_REGIONS);
    if (!parsed.ok) problems.push(...parsed.problems.map((p) => `--round-trips: ${p}`));
    else {
      const missing = missingPairs(parsed.roundTrips, STACK_REGIONS);
      if (missing.length > 0) problems.push(`--round-trips: no round trip for ${missing.join(', ')}`);
      else roundTrips = parsed.roundTrips;
    }
    for (const setting of LINK_SETTINGS)
      if (setting in o.overrides)
        problems.push(
          `--set ${setting}: with --geo the links are the round-trip matrix's (--round-trips), times --compress`,
        );
  }
  for (const fixed of FIXED_BY_STACK) {
    if (!(fixed.setting in o.overrides)) continue;
    if (o.geo !== undefined && LINK_SETTINGS.includes(fixed.setting)) continue;
    const given = o.overrides[fixed.setting]!;
    const same = typeof fixed.value === 'number' ? Number(given) === fixed.value : given === fixed.value;
    if (!same)
      problems.push(
        `--set ${fixed.setting}=${given}: ${fixed.why}; the replay runs ${fixed.setting}=${String(fixed.value) || "''"}`,
      );
  }
  const halfLife = defaultRebalanceSettings.demandHalfLifeMs * K;
  if ('demandHalfLifeMs' in o.overrides && Number(o.overrides['demandHalfLifeMs']) !== halfLife)
    problems.push(
      `--set demandHalfLifeMs: the coordinator smooths demand over ${defaultRebalanceSettings.demandHalfLifeMs} ms of wall time and takes no setting for it, which is ${halfLife} ms of scenario time at --compress ${K}`,
    );
  if (problems.length > 0) throw new SimConfigError(problems.join('\n'));

  // The user's settings, layered exactly as the simulator layers them.
  const base = planRuns({ ...o, strategies: [ideal], sweep: undefined })[0]!.settings;
  if (base.kind !== undefined && base.kind !== 'token_bucket')
    throw new SimConfigError(
      `--real-stack replays token-bucket policies only (kind ${base.kind}: its slots and windows are predicted, not replayed)`,
    );
  const user: Settings = {
    ...base,
    forwardTimeoutMs:
      'forwardTimeoutMs' in o.overrides ? base.forwardTimeoutMs : DEFAULT_DECISION_DEADLINE_MS * K,
  };

  const wallOf: Record<string, number> = {};
  const stackEnv: Record<string, string> = {};
  const effective: Record<string, number | string> = {};
  for (const t of TIMERS) {
    const value = user[t.setting];
    const wall = Math.round(value / K);
    if (wall < t.min || wall > t.max) {
      problems.push(
        `--compress ${K} turns ${t.setting}=${value} into ${t.env.replace(/^QP_(COORDINATOR|AGENT)_/, 'QP_')}=${wall} ms of wall time, outside the service's [${t.min}, ${t.max}]: lower --compress or change ${t.setting}`,
      );
      continue;
    }
    wallOf[t.setting] = wall;
    stackEnv[t.env] = String(wall);
    // What the stack will enforce, back in scenario time (a whole number of wall ms, times K).
    effective[t.setting] = wall * K;
  }
  const overrideTtlMs = Math.round(defaultLeaseSettings.overrideTtlMs / K);
  if (overrideTtlMs < MIN_OVERRIDE_TTL_MS)
    problems.push(
      `--compress ${K} turns the ${defaultLeaseSettings.overrideTtlMs} ms override TTL into ${overrideTtlMs} ms of wall time, below the coordinator's ${MIN_OVERRIDE_TTL_MS} ms: use --compress ≤ ${Math.floor(defaultLeaseSettings.overrideTtlMs / MIN_OVERRIDE_TTL_MS)}`,
    );
  if (problems.length > 0) throw new SimConfigError(problems.join('\n'));
  stackEnv['QP_COORDINATOR_OVERRIDE_TTL_MS'] = String(overrideTtlMs);
  stackEnv['QP_COORDINATOR_MAX_OVERRIDES'] = String(user.maxOverrides);

  if (roundTrips !== undefined && wallOf['reportIntervalMs'] !== undefined) {
    // An agent takes a renewal only within one report interval of its heartbeat (core/lease/agent-lease.ts
    // `renewed`; its request waits no longer, regional-agent/leases/lease-holder.ts). Compression shortens the
    // interval, not the links: below a link's round trip the agents across it never hold a lease, and within a few
    // ms of it the links' jitter and the processes' own delays, which the prediction has none of, decide who does.
    const longest = Math.max(...STACK_REGIONS.map((r) => farthestRoundTrip(roundTrips, r)));
    const needed = linkAllowanceMs(longest);
    const interval = wallOf['reportIntervalMs'];
    if (interval < needed) {
      const most = Math.floor(user.reportIntervalMs / needed);
      throw new SimConfigError(
        `--compress ${K} turns reportIntervalMs=${user.reportIntervalMs} into ${interval} ms of wall time, shorter than the ${needed} ms a heartbeat's renewal needs across the longest link (1.25 × ${longest} ms): the agents there could not renew their leases; ${most >= 1 ? `use --compress ≤ ${most} or` : 'use'} a longer reportIntervalMs`,
      );
    }
  }
  if (roundTrips !== undefined) {
    // The agents' decisions wait the deadline plus the farthest link's allowance (regional-agent/start.ts: a
    // refusal's borrow and a top-up alike; strict forwarding by its home's round trip): the prediction's deadline
    // is that, in scenario time. The farthest round trip of any region, as the simulator has one deadline.
    const farthest = Math.max(...STACK_REGIONS.map((r) => farthestRoundTrip(roundTrips, r)));
    effective['forwardTimeoutMs'] = (wallOf['forwardTimeoutMs']! + linkAllowanceMs(farthest)) * K;
    stackEnv['QP_STACK_TOPOLOGY'] = 'geo';
    stackEnv['QP_STACK_ROUND_TRIPS'] = formatRoundTrips(roundTrips, STACK_REGIONS);
  }
  let settings: Settings;
  try {
    settings = resolveSettings(user, effective, {
      demandHalfLifeMs: halfLife,
      linkDelayMs: 0,
      linkJitterMs: 0,
      linkLoss: 0,
      links: roundTrips === undefined ? '' : geoLinks(roundTrips, STACK_REGIONS, K),
    });
  } catch (error) {
    if (error instanceof ZodError) throw new SimConfigError(`settings at --compress ${K}: ${issues(error)}`);
    throw error;
  }

  const predictions: RunSpec[] = [ideal, ...strategies].map((strategy) => ({
    scenario,
    strategy,
    regionCount: regions.length,
    seed: o.seed,
    settings,
  }));
  for (const spec of predictions) validateRun(spec);

  const targets = strategies.map((strategy) => ({
    strategy,
    policy: compressedPolicy(settings, strategy, regions, K),
  }));
  const wall: WallTiming = {
    roundMs: wallOf['roundMs']!,
    reportIntervalMs: wallOf['reportIntervalMs']!,
    leaseMs: wallOf['leaseMs']!,
    graceMs: wallOf['graceMs']!,
    skewMs: wallOf['skewMs']!,
    overrideTtlMs,
    decisionDeadlineMs: wallOf['forwardTimeoutMs']!,
  };
  return {
    scenario,
    seed: o.seed,
    compression: K,
    regions,
    settings,
    wall,
    stackEnv,
    targets,
    predictions,
    roundTrips: roundTrips === undefined ? undefined : formatRoundTrips(roundTrips, STACK_REGIONS),
  };
}

/**
 * The policy the simulator enforces for `strategy` (core/policy/policy.ts, via the engine's own `simPolicy`), with its
 * refill (and each class's) multiplied by K and its idle TTL divided by K (rounded up: the stack takes whole
 * seconds).
 */
export function compressedPolicy(
  settings: Settings,
  strategy: StrategyDefinition,
  regions: readonly string[],
  compression: number,
): PolicySpecInput {
  const p = simPolicy(settings, strategy, regions);
  const body: PolicySpecInput = {
    capacity: p.capacity,
    refillPerSecond: p.refillPerSecond * compression,
    maxCost: p.maxCost,
    mode: p.mode,
    onStoreFailure: p.onStoreFailure,
    idleTtlSeconds: Math.ceil(p.idleTtlSeconds / compression),
    ...(p.mode === 'strict' ? { homeRegion: p.homeRegion } : {}),
    ...(p.minShare !== undefined ? { minShare: p.minShare } : {}),
    // Subject classes (tiered-tenants): each class's refill compressed as the policy's; the replayer sends the
    // subjects by the names the policy's `subjects` map holds.
    ...(p.classes === undefined
      ? {}
      : {
          classes: Object.fromEntries(
            Object.entries(p.classes).map(([name, c]) => [
              name,
              { capacity: c.capacity, refillPerSecond: c.refillPerSecond * compression, maxCost: c.maxCost },
            ]),
          ),
          subjects: p.subjects,
        }),
  };
  const parsed = PolicySpec.safeParse(body);
  if (!parsed.success)
    throw new SimConfigError(
      `the compressed policy for ${strategy.name} is invalid: ${issues(parsed.error)}`,
    );
  return body;
}

/** Wall seconds and mean wall rate of a replay of `requests` arrivals; throws when over the bounds. */
export function replayLoad(plan: ReplayPlan, requests: number): { wallSeconds: number; meanRate: number } {
  const wallSeconds = plan.settings.durationS / plan.compression;
  const meanRate = requests / wallSeconds;
  const problems: string[] = [];
  if (wallSeconds > MAX_WALL_SECONDS)
    problems.push(
      `${plan.settings.durationS} s of ${plan.scenario.name} at --compress ${plan.compression} take ${wallSeconds.toFixed(0)} s of wall time per strategy, more than ${MAX_WALL_SECONDS} s: raise --compress or shorten --duration`,
    );
  if (meanRate > MAX_WALL_RATE)
    problems.push(
      `${plan.scenario.name} at --compress ${plan.compression} asks the stack for ${meanRate.toFixed(0)} requests/s on average, more than ${MAX_WALL_RATE}: lower --compress or the scenario's load`,
    );
  if (problems.length > 0) throw new SimConfigError(problems.join('\n'));
  return { wallSeconds, meanRate };
}
