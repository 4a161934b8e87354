/**
 * The real-stack replay's plan (simulations/replay/replay-plan.ts) and its flags (simulations/cli-args.ts): pure,
 * no stack. What the stack is started with at a compression K, the policy each strategy gets, and every refusal
 * with the message a user reads.
 */
import { describe, expect, it } from 'vitest';
import { parseCli, type CliOptions } from '../../../../simulations/cli-args.js';
import { SimConfigError } from '../../../../simulations/errors.js';
import { captureArrivals } from '../../../../simulations/replay/arrivals.js';
import {
  compressedPolicy,
  DEFAULT_COMPRESSION,
  DEFAULT_GEO_COMPRESSION,
  MAX_COMPRESSION,
  MAX_WALL_RATE,
  MAX_WALL_SECONDS,
  planReplay,
  REPLAY_MODES,
  REPLAY_STACK_VARS,
  replayLoad,
  UNSUPPORTED_SCENARIOS,
  type ReplayPlan,
} from '../../../../simulations/replay/replay-plan.js';
import { DEFAULT_SETTINGS } from '../../../../simulations/settings.js';
import { findStrategy } from '../../../../simulations/strategies/registry.js';

const cli = (...argv: string[]): CliOptions => {
  const p = parseCli(argv);
  if (p.help) throw new Error('unexpected --help');
  return p;
};

/** The plan of a command line, as `runReplay` makes it. */
const plan = (...argv: string[]): ReplayPlan => {
  const o = cli(...argv);
  if (o.realStack === undefined) throw new Error('not a --real-stack command line');
  return planReplay({ ...o, compression: o.realStack.compression, geo: o.realStack.geo });
};

/** The SimConfigError message of a command line's plan (fails the test if it plans). */
const refusal = (...argv: string[]): string => {
  try {
    plan(...argv);
  } catch (error) {
    expect(error).toBeInstanceOf(SimConfigError);
    return (error as Error).message;
  }
  throw new Error(`planned: ${argv.join(' ')}`);
};

describe('planReplay at --compress 10 with default settings', () => {
  const p = plan('--scenario', 'step-shift', '--real-stack', '--strategies', 'dynamic,strict,independent');

  it('divides every protocol timer by K into whole wall ms, and puts them in the stack environment', () => {
    expect(p.compression).toBe(DEFAULT_COMPRESSION);
    expect(p.compression).toBe(10);
    expect(p.regions).toEqual(['us', 'eu', 'ap']);
    expect(p.wall).toEqual({
      roundMs: 100,
      reportIntervalMs: 100,
      leaseMs: 600,
      graceMs: 1200,
      skewMs: 100,
      overrideTtlMs: 3000,
      // The agent's own default deadline, not the simulator's forwardTimeoutMs / K.
      decisionDeadlineMs: 250,
    });
    expect(p.stackEnv).toEqual({
      QP_COORDINATOR_ROUND_MS: '100',
      QP_COORDINATOR_REPORT_INTERVAL_MS: '100',
      QP_COORDINATOR_LEASE_MS: '600',
      QP_COORDINATOR_GRACE_MS: '1200',
      QP_COORDINATOR_SKEW_MS: '100',
      QP_AGENT_DECISION_DEADLINE_MS: '250',
      QP_COORDINATOR_CONFIRM_MS: '6000',
      QP_COORDINATOR_OVERRIDE_TTL_MS: '3000',
      QP_COORDINATOR_MAX_OVERRIDES: '0',
    });
    // The caller may set none of them: the replay refuses to start a stack over them (conflictingEnv), nor the
    // topology's variables, which decide the links the prediction models.
    expect([...REPLAY_STACK_VARS].sort()).toEqual(
      [
        ...Object.keys(p.stackEnv),
        'QP_STACK_TOPOLOGY',
        'QP_STACK_ROUND_TRIPS',
        'QP_STACK_LINK_JITTER',
        'QP_AGENT_ROUND_TRIPS',
      ].sort(),
    );
  });

  it('predicts on the settings the stack enforces, in scenario time', () => {
    expect(p.settings).toMatchObject({
      // Timers back in scenario time: wall ms × K.
      roundMs: 1000,
      reportIntervalMs: 1000,
      leaseMs: 6000,
      graceMs: 12_000,
      skewMs: 1000,
      // The agents' 250 ms deadline is 2500 ms of scenario time (the simulator's own default is 250).
      forwardTimeoutMs: 2500,
      // The coordinator's fixed 2000 ms of wall time.
      demandHalfLifeMs: 20_000,
      // Loopback, one agent per region, the coordinator's fixed rebalancing.
      linkDelayMs: 0,
      linkJitterMs: 0,
      linkLoss: 0,
      links: '',
      agentsPerRegion: 1,
      damping: 0.85,
      hysteresis: 0.08,
      // Step-shift's own defaults are kept.
      load: 1.5,
      warmupS: 120,
      durationS: 300,
      capacity: 100,
      refillPerSecond: 2,
      maxOverrides: 0,
      // The coordinator's confirmMs, a minute, is a timer like the others: 6 s of wall time.
      confirmMs: 60_000,
    });
    expect(DEFAULT_SETTINGS.forwardTimeoutMs).toBe(250);
    expect(p.predictions.map((s) => s.strategy.name)).toEqual(['ideal', 'dynamic', 'strict', 'independent']);
    for (const spec of p.predictions) {
      expect(spec.settings).toBe(p.settings);
      expect([spec.seed, spec.regionCount, spec.scenario.name]).toEqual([1, 3, 'step-shift']);
    }
  });

  it('creates each strategy’s policy with refill × K, capacity kept and idle TTL ⌈TTL / K⌉', () => {
    // The simulated policy's idle TTL is max(60, ⌈100 / 2⌉) = 60 s: 6 s on the stack.
    expect(p.targets.map((t) => [t.strategy.name, t.policy])).toEqual([
      [
        'dynamic',
        {
          capacity: 100,
          refillPerSecond: 20,
          maxCost: 1,
          mode: 'regional',
          onStoreFailure: 'closed',
          idleTtlSeconds: 6,
          minShare: 0.02,
        },
      ],
      [
        'strict',
        {
          capacity: 100,
          refillPerSecond: 20,
          maxCost: 1,
          mode: 'strict',
          onStoreFailure: 'closed',
          idleTtlSeconds: 6,
          homeRegion: 'us',
        },
      ],
      [
        'independent',
        {
          capacity: 100,
          refillPerSecond: 20,
          maxCost: 1,
          mode: 'local',
          onStoreFailure: 'closed',
          idleTtlSeconds: 6,
        },
      ],
    ]);
    expect(p.targets.map((t) => REPLAY_MODES[t.strategy.name])).toEqual(['regional', 'strict', 'local']);
  });
});

describe('planReplay: compression rule', () => {
  it('rounds each timer to whole wall ms and predicts with the rounded value × K (K = 7)', () => {
    const p = plan('--scenario', 'step-shift', '--real-stack', '--compress', '7', '--strategies', 'dynamic');
    // 1000 / 7 = 142.86 → 143; 6000 / 7 = 857.14 → 857; 12000 / 7 = 1714.29 → 1714; 30000 / 7 = 4285.7 → 4286.
    expect(p.wall).toEqual({
      roundMs: 143,
      reportIntervalMs: 143,
      leaseMs: 857,
      graceMs: 1714,
      skewMs: 143,
      overrideTtlMs: 4286,
      decisionDeadlineMs: 250,
    });
    expect(p.settings).toMatchObject({
      roundMs: 1001,
      reportIntervalMs: 1001,
      leaseMs: 5999,
      graceMs: 11_998,
      skewMs: 1001,
      forwardTimeoutMs: 1750,
      demandHalfLifeMs: 14_000,
    });
    // 60 s / 7 = 8.57 → 9 s: rounded up, never below what the bucket needs to refill (100 / 14 = 7.1 s).
    expect(p.targets[0]!.policy).toMatchObject({ capacity: 100, refillPerSecond: 14, idleTtlSeconds: 9 });
  });

  it('keeps the capacity, multiplies the refill and rounds the idle TTL up for a policy the user set', () => {
    const p = plan(
      '--scenario',
      'uniform',
      '--real-stack',
      '--strategies',
      'dynamic',
      '--set',
      'capacity=50',
      '--set',
      'refillPerSecond=0.4',
    );
    // Idle TTL max(60, ⌈50 / 0.4⌉) = 125 s → ⌈12.5⌉ = 13 s.
    expect(p.targets[0]!.policy).toEqual({
      capacity: 50,
      refillPerSecond: 4,
      maxCost: 1,
      mode: 'regional',
      onStoreFailure: 'closed',
      idleTtlSeconds: 13,
      minShare: 0.02,
    });
    // C + R·W over a scenario window W is the same number of tokens as C + (R·K)·(W/K) on the stack.
    const W = 60;
    expect(50 + 0.4 * W).toBeCloseTo(50 + 4 * (W / 10), 12);
  });

  it('takes a decision deadline the user set, compressed like the other timers', () => {
    const p = plan('--scenario', 'uniform', '--real-stack', '--set', 'forwardTimeoutMs=800');
    expect(p.wall.decisionDeadlineMs).toBe(80);
    expect(p.stackEnv['QP_AGENT_DECISION_DEADLINE_MS']).toBe('80');
    expect(p.settings.forwardTimeoutMs).toBe(800);
  });

  it('accepts a fixed setting given at the value the stack runs', () => {
    const p = plan(
      '--scenario',
      'uniform',
      '--real-stack',
      '--set',
      'linkDelayMs=0',
      '--set',
      'links=',
      '--set',
      'agentsPerRegion=1',
      '--set',
      'damping=0.85',
      '--set',
      'hysteresis=0.08',
      '--set',
      'demandHalfLifeMs=20000',
    );
    expect(p.settings.demandHalfLifeMs).toBe(20_000);
  });

  it('builds the same policy through compressedPolicy as the plan', () => {
    const p = plan('--scenario', 'uniform', '--real-stack', '--compress', '5', '--strategies', 'strict');
    expect(compressedPolicy(p.settings, findStrategy('strict')!, p.regions, 5)).toEqual(p.targets[0]!.policy);
    expect(p.targets[0]!.policy).toMatchObject({ refillPerSecond: 10, idleTtlSeconds: 12, homeRegion: 'us' });
  });

  it("puts the enterprise class on the stack's policy too, its refill compressed as the policy's", () => {
    const p = plan(
      '--scenario',
      'tiered-tenants',
      '--real-stack',
      '--compress',
      '5',
      '--strategies',
      'dynamic',
    );
    expect(p.targets[0]!.policy).toMatchObject({
      refillPerSecond: 10,
      classes: { enterprise: { capacity: 1000, refillPerSecond: 100, maxCost: 1 } },
      subjects: { s8: 'enterprise', s9: 'enterprise' },
    });
  });
});

describe('planReplay refusals', () => {
  it.each(Object.keys(UNSUPPORTED_SCENARIOS))('refuses %s with its reason', (name) => {
    expect(refusal('--scenario', name, '--real-stack')).toBe(
      `--real-stack cannot replay ${name}: ${UNSUPPORTED_SCENARIOS[name]}`,
    );
  });

  it('names each reason exactly', () => {
    expect(refusal('--scenario', 'coordinator-crash', '--real-stack')).toBe(
      '--real-stack cannot replay coordinator-crash: the stack launcher stops every process when one of them dies, so it cannot crash and restart the coordinator alone',
    );
    expect(refusal('--scenario', 'region-partition', '--real-stack')).toBe(
      '--real-stack cannot replay region-partition: the agents reach NATS directly on loopback; cutting one region off needs a proxy the launcher does not put in between',
    );
    expect(refusal('--scenario', 'ignore-retry-after', '--real-stack')).toBe(
      '--real-stack cannot replay ignore-retry-after: client retries depend on the real answers, while the replay sends a list of arrivals fixed in advance (open loop)',
    );
  });

  it('refuses static and naive-dynamic, and a list with ideal alone', () => {
    expect(refusal('--scenario', 'uniform', '--real-stack', '--strategies', 'static')).toBe(
      '--real-stack cannot replay static: the coordinator moves the shares of every regional policy; a fixed split has no counterpart on the stack (replayable: dynamic, strict, independent)',
    );
    expect(refusal('--scenario', 'uniform', '--real-stack', '--strategies', 'naive-dynamic')).toBe(
      '--real-stack cannot replay naive-dynamic: it exists in the simulator only (the rebalancer without the two-phase protocol, for comparison) (replayable: dynamic, strict, independent)',
    );
    expect(refusal('--scenario', 'uniform', '--real-stack', '--strategies', 'ideal')).toBe(
      '--real-stack needs a strategy the stack enforces: dynamic, strict, independent',
    );
  });

  it.each([['1'], ['2'], ['4']])('refuses --regions %s', (n) => {
    expect(refusal('--scenario', 'uniform', '--real-stack', '--regions', n)).toBe(
      "--real-stack runs the stack's 3 regions (us, eu, ap): use --regions 3",
    );
  });

  it.each([
    ['linkDelayMs=5', '--set linkDelayMs=5: the stack runs on loopback; the replay runs linkDelayMs=0'],
    ['linkJitterMs=1', '--set linkJitterMs=1: the stack runs on loopback; the replay runs linkJitterMs=0'],
    ['linkLoss=0.1', '--set linkLoss=0.1: the stack runs on loopback; the replay runs linkLoss=0'],
    ['links=us-eu=10/1/0', "--set links=us-eu=10/1/0: the stack runs on loopback; the replay runs links=''"],
    [
      'agentsPerRegion=2',
      '--set agentsPerRegion=2: the launcher runs one agent per region; the replay runs agentsPerRegion=1',
    ],
    [
      'damping=0.5',
      '--set damping=0.5: the coordinator takes no setting for it; the replay runs damping=0.85',
    ],
    [
      'hysteresis=0.1',
      '--set hysteresis=0.1: the coordinator takes no setting for it; the replay runs hysteresis=0.08',
    ],
    [
      'demandHalfLifeMs=2000',
      '--set demandHalfLifeMs: the coordinator smooths demand over 2000 ms of wall time and takes no setting for it, which is 20000 ms of scenario time at --compress 10',
    ],
  ])('refuses --set %s', (assignment, message) => {
    expect(refusal('--scenario', 'uniform', '--real-stack', '--set', assignment)).toBe(message);
  });

  it('lists every problem of the options at once', () => {
    expect(
      refusal(
        '--scenario',
        'coordinator-crash',
        '--real-stack',
        '--regions',
        '2',
        '--strategies',
        'ideal,static,dynamic,naive-dynamic',
        '--set',
        'linkDelayMs=5',
        '--set',
        'demandHalfLifeMs=2000',
      ).split('\n'),
    ).toEqual([
      '--real-stack cannot replay coordinator-crash: the stack launcher stops every process when one of them dies, so it cannot crash and restart the coordinator alone',
      "--real-stack runs the stack's 3 regions (us, eu, ap): use --regions 3",
      '--real-stack cannot replay static: the coordinator moves the shares of every regional policy; a fixed split has no counterpart on the stack (replayable: dynamic, strict, independent)',
      '--real-stack cannot replay naive-dynamic: it exists in the simulator only (the rebalancer without the two-phase protocol, for comparison) (replayable: dynamic, strict, independent)',
      '--set linkDelayMs=5: the stack runs on loopback; the replay runs linkDelayMs=0',
      '--set demandHalfLifeMs: the coordinator smooths demand over 2000 ms of wall time and takes no setting for it, which is 20000 ms of scenario time at --compress 10',
    ]);
  });

  it('refuses a compression that pushes timers out of the services’ range, every timer and the override TTL', () => {
    // 1000 / 40 = 25 ms < 50; 30000 / 40 = 750 ms < 1000.
    expect(refusal('--scenario', 'uniform', '--real-stack', '--compress', '40').split('\n')).toEqual([
      "--compress 40 turns roundMs=1000 into QP_ROUND_MS=25 ms of wall time, outside the service's [50, 60000]: lower --compress or change roundMs",
      "--compress 40 turns reportIntervalMs=1000 into QP_REPORT_INTERVAL_MS=25 ms of wall time, outside the service's [50, 60000]: lower --compress or change reportIntervalMs",
      "--compress 40 turns the 30000 ms override TTL into 750 ms of wall time, below the coordinator's 1000 ms: use --compress ≤ 30",
    ]);
    expect(refusal('--scenario', 'step-shift', '--real-stack', '--set', 'roundMs=400')).toBe(
      "--compress 10 turns roundMs=400 into QP_ROUND_MS=40 ms of wall time, outside the service's [50, 60000]: lower --compress or change roundMs",
    );
    // The largest compression the default timers allow: 20 (1000 / 20 = 50 ms).
    expect(plan('--scenario', 'uniform', '--real-stack', '--compress', '20').wall.roundMs).toBe(50);
    expect(refusal('--scenario', 'uniform', '--real-stack', '--compress', '21')).toMatch(
      /^--compress 21 turns roundMs=1000 into QP_ROUND_MS=48 ms/,
    );
  });

  it('refuses the override TTL bound alone when the timers fit', () => {
    expect(
      refusal(
        '--scenario',
        'uniform',
        '--real-stack',
        '--compress',
        '40',
        '--set',
        'roundMs=2000',
        '--set',
        'reportIntervalMs=2000',
      ),
    ).toBe(
      "--compress 40 turns the 30000 ms override TTL into 750 ms of wall time, below the coordinator's 1000 ms: use --compress ≤ 30",
    );
  });

  it('refuses --sweep, several scenarios and a compression outside [1, 100] before anything else', () => {
    expect(refusal('--scenario', 'uniform', '--real-stack', '--sweep', 'leaseMs=6000,8000')).toBe(
      '--real-stack does not sweep: drop --sweep',
    );
    expect(refusal('--scenario', 'uniform,zipf', '--real-stack')).toBe(
      '--real-stack replays one scenario at a time (give one --scenario)',
    );
    expect(refusal('--scenario', 'all', '--real-stack')).toBe(
      '--real-stack replays one scenario at a time (give one --scenario)',
    );
    const o = cli('--scenario', 'uniform', '--real-stack');
    for (const compression of [0, 101, 2.5])
      expect(() => planReplay({ ...o, compression })).toThrow(
        new SimConfigError(`--compress must be an integer in [1, ${MAX_COMPRESSION}], got ${compression}`),
      );
  });

  it('refuses settings the simulator itself refuses, as SimConfigError', () => {
    expect(
      refusal('--scenario', 'step-shift', '--real-stack', '--duration', '60', '--set', 'shiftAtS=20'),
    ).toBe('warmupS (120) must be before the end of the run (durationS 60): nothing would be measured');
    expect(refusal('--scenario', 'uniform', '--real-stack', '--set', 'capacity=-1')).toMatch(
      /^invalid settings for uniform: capacity/,
    );
  });
});

describe('planReplay --geo', () => {
  // At K = 10 the default 1000 ms report interval is 100 ms of wall time, shorter than a renewal across 220 ms:
  // 3000 ms (300 wall) with a lease and grace to match, as the services require of them.
  const longReports = ['--set', 'reportIntervalMs=3000', '--set', 'leaseMs=12000', '--set', 'graceMs=24000'];

  it('starts the geo topology and gives the prediction the same round trips, times K, on its links', () => {
    const loopback = plan('--scenario', 'step-shift', '--real-stack', '--compress', '10', ...longReports);
    const p = plan('--scenario', 'step-shift', '--real-stack', '--geo', '--compress', '10', ...longReports);
    expect(p.roundTrips).toBe('us-eu=70,us-ap=150,eu-ap=220');
    expect(loopback.roundTrips).toBeUndefined();
    expect(p.stackEnv).toEqual({
      ...loopback.stackEnv,
      QP_STACK_TOPOLOGY: 'geo',
      QP_STACK_ROUND_TRIPS: 'us-eu=70,us-ap=150,eu-ap=220',
    });
    for (const name of Object.keys(p.stackEnv)) expect(REPLAY_STACK_VARS).toContain(name);
    // One way is half the round trip, times K = 10, in scenario ms; no loss; the links' ±10 % jitter has mean 0.
    expect(p.settings.links).toBe('us-eu=350/0/0,us-ap=750/0/0,eu-ap=1100/0/0');
    // The agents wait their 250 ms deadline plus the farthest link's allowance, 1.25 × 220 = 275 ms: 525 ms of
    // wall time, 5250 of scenario time (loopback: 2500).
    expect(p.wall.decisionDeadlineMs).toBe(250);
    expect(p.settings.forwardTimeoutMs).toBe(5250);
    expect(loopback.settings.forwardTimeoutMs).toBe(2500);
    expect({ ...p.settings, links: '', forwardTimeoutMs: 2500 }).toEqual(loopback.settings);
  });

  it('replays at K = 3 by default, the largest whose report interval carries a renewal across the longest link', () => {
    expect(DEFAULT_GEO_COMPRESSION).toBe(3);
    const p = plan('--scenario', 'step-shift', '--real-stack', '--geo');
    expect(p.compression).toBe(3);
    // 1000 / 3 = 333 ms of wall time ≥ 1.25 × 220 = 275 ms; the prediction runs the rounded 333 × 3.
    expect(p.wall.reportIntervalMs).toBe(333);
    expect(p.settings.reportIntervalMs).toBe(999);
    expect(p.settings.links).toBe('us-eu=105/0/0,us-ap=225/0/0,eu-ap=330/0/0');
    expect(p.settings.forwardTimeoutMs).toBe((250 + 275) * 3);
    // Loopback keeps K = 10.
    expect(plan('--scenario', 'step-shift', '--real-stack').compression).toBe(DEFAULT_COMPRESSION);
  });

  it('refuses a K whose report interval is shorter than a renewal across the longest link: the agents there would never hold a lease', () => {
    expect(refusal('--scenario', 'step-shift', '--real-stack', '--geo', '--compress', '4')).toBe(
      "--compress 4 turns reportIntervalMs=1000 into 250 ms of wall time, shorter than the 275 ms a heartbeat's renewal needs across the longest link (1.25 × 220 ms): the agents there could not renew their leases; use --compress ≤ 3 or a longer reportIntervalMs",
    );
    expect(refusal('--scenario', 'step-shift', '--real-stack', '--geo', '--compress', '10')).toMatch(
      /^--compress 10 turns reportIntervalMs=1000 into 100 ms of wall time, shorter than the 275 ms/,
    );
    // A nearer matrix allows more.
    expect(
      plan(
        '--scenario',
        'step-shift',
        '--real-stack',
        '--geo',
        '--compress',
        '10',
        '--round-trips',
        'us-eu=40,us-ap=60,eu-ap=80',
      ).compression,
    ).toBe(10);
    expect(
      refusal(
        '--scenario',
        'step-shift',
        '--real-stack',
        '--geo',
        '--compress',
        '1',
        '--round-trips',
        'us-eu=70,us-ap=150,eu-ap=900',
      ),
    ).toMatch(
      /1125 ms a heartbeat's renewal needs across the longest link \(1\.25 × 900 ms\).*; use a longer reportIntervalMs$/,
    );
  });

  it('takes --round-trips, scaled by --compress', () => {
    const p = plan(
      '--scenario',
      'homed-tenants',
      '--real-stack',
      '--compress',
      '5',
      '--geo',
      '--round-trips',
      'eu-ap=100,us-eu=40,us-ap=60',
    );
    expect(p.roundTrips).toBe('us-eu=40,us-ap=60,eu-ap=100');
    expect(p.settings.links).toBe('us-eu=100/0/0,us-ap=150/0/0,eu-ap=250/0/0');
    // (250 ms + 1.25 × 100 ms) × 5: the agents' own deadline and the farthest link's allowance, in scenario ms.
    expect(p.wall.decisionDeadlineMs).toBe(250);
    expect(p.settings.forwardTimeoutMs).toBe((250 + 125) * 5);
  });

  it('refuses link settings, an incomplete matrix, and --geo or --round-trips out of place', () => {
    expect(refusal('--scenario', 'step-shift', '--real-stack', '--geo', '--set', 'linkDelayMs=0')).toBe(
      "--set linkDelayMs: with --geo the links are the round-trip matrix's (--round-trips), times --compress",
    );
    expect(
      refusal('--scenario', 'step-shift', '--real-stack', '--geo', '--round-trips', 'us-eu=70,us-ap=150'),
    ).toBe('--round-trips: no round trip for eu-ap');
    expect(() => cli('--scenario', 'step-shift', '--geo')).toThrow(
      new SimConfigError('--geo applies to --real-stack only'),
    );
    expect(() => cli('--scenario', 'step-shift', '--real-stack', '--round-trips', 'us-eu=1')).toThrow(
      new SimConfigError('--round-trips applies to --geo only'),
    );
  });
});

describe('replayLoad', () => {
  const k1 = (duration: string) =>
    plan('--scenario', 'uniform', '--real-stack', '--compress', '1', '--duration', duration);

  it('accepts up to 300 wall seconds per strategy and 1500 requests per wall second', () => {
    expect([MAX_WALL_SECONDS, MAX_WALL_RATE]).toEqual([300, 1500]);
    expect(replayLoad(k1('300'), 450_000)).toEqual({ wallSeconds: 300, meanRate: 1500 });
    expect(replayLoad(plan('--scenario', 'uniform', '--real-stack'), 24_000)).toEqual({
      wallSeconds: 30,
      meanRate: 800,
    });
  });

  it('refuses a replay longer than 300 wall seconds or faster than 1500 requests/s, both at once', () => {
    expect(() => replayLoad(k1('301'), 1000)).toThrow(
      new SimConfigError(
        '301 s of uniform at --compress 1 take 301 s of wall time per strategy, more than 300 s: raise --compress or shorten --duration',
      ),
    );
    expect(() => replayLoad(k1('300'), 450_001)).toThrow(
      new SimConfigError(
        "uniform at --compress 1 asks the stack for 1500 requests/s on average, more than 1500: lower --compress or the scenario's load",
      ),
    );
    expect(() => replayLoad(k1('400'), 900_000)).toThrow(
      new SimConfigError(
        [
          '400 s of uniform at --compress 1 take 400 s of wall time per strategy, more than 300 s: raise --compress or shorten --duration',
          "uniform at --compress 1 asks the stack for 2250 requests/s on average, more than 1500: lower --compress or the scenario's load",
        ].join('\n'),
      ),
    );
  });

  it('refuses one-shot-identities at --compress 10 on its real arrivals (about 2100 requests/s)', () => {
    const p = plan('--scenario', 'one-shot-identities', '--real-stack');
    const arrivals = captureArrivals(p.predictions[0]!);
    const rate = arrivals.length / 30;
    // 200 new identities/s plus 5 subjects × load 1 × R 2 = 210 requests per scenario second, × 10.
    expect(rate).toBeGreaterThan(2000);
    expect(rate).toBeLessThan(2200);
    expect(() => replayLoad(p, arrivals.length)).toThrow(
      `one-shot-identities at --compress 10 asks the stack for ${rate.toFixed(0)} requests/s on average, more than 1500`,
    );
  });
});

describe('CLI flags of the replay', () => {
  it('--real-stack: strategy dynamic by default, compression 10, its own output folder', () => {
    const o = cli('--scenario', 'step-shift', '--real-stack');
    expect(o.realStack).toEqual({ compression: 10, attach: undefined });
    expect(o.strategies.map((s) => s.name)).toEqual(['dynamic']);
    expect(o.outDir).toBe('.sim-out/step-shift-real-stack');
    expect(cli('--scenario', 'step-shift').realStack).toBeUndefined();
    expect(cli('--scenario', 'step-shift').outDir).toBe('.sim-out/step-shift');
    // Given strategies and --out are kept as given.
    const given = cli(
      '--scenario',
      'uniform',
      '--real-stack',
      '--compress',
      '5',
      '--strategies',
      'strict,independent',
      '--out',
      '/tmp/x',
    );
    expect(given.realStack).toEqual({ compression: 5, attach: undefined });
    expect(given.strategies.map((s) => s.name)).toEqual(['strict', 'independent']);
    expect(given.outDir).toBe('/tmp/x');
  });

  it('--attach FILE implies --real-stack', () => {
    const o = cli('--scenario', 'uniform', '--attach', '/tmp/state.json');
    expect(o.realStack).toEqual({ compression: 10, attach: '/tmp/state.json' });
    expect(o.strategies.map((s) => s.name)).toEqual(['dynamic']);
    expect(o.outDir).toBe('.sim-out/uniform-real-stack');
    expect(cli('--scenario', 'uniform', '--attach', 's.json', '--compress', '20').realStack).toEqual({
      compression: 20,
      attach: 's.json',
    });
  });

  it.each([
    [['--compress', '5'], '--compress applies to --real-stack only'],
    [['--attach', ''], '--attach needs the path of a stack state file'],
    [['--attach', '  '], '--attach needs the path of a stack state file'],
    [['--real-stack', '--compress', '0'], '--compress must be an integer in [1, 100], got "0"'],
    [['--real-stack', '--compress', '101'], '--compress must be an integer in [1, 100], got "101"'],
    [['--real-stack', '--compress', 'abc'], '--compress must be an integer in [1, 100], got "abc"'],
    [['--real-stack', '--compress', '2.5'], '--compress must be an integer in [1, 100], got "2.5"'],
    [['--attach', 'x.json', '--compress=-1'], '--compress must be an integer in [1, 100], got "-1"'],
  ])('refuses %j', (argv, message) => {
    expect(() => cli('--scenario', 'uniform', ...argv)).toThrow(new SimConfigError(message));
  });
});
