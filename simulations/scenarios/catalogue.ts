/**
 * The scenarios of docs/design.md "What the simulator measures". Unless a scenario says otherwise: policy C = 100 tokens,
 * R = 2 tokens/s, costs 1..maxCost, 300 simulated seconds, and `load` is a regular subject's demand in units of
 * its budget R (so load 2 asks twice what the policy allows over time).
 */
import type { Scenario, ScenarioPlan, TimedFault, TrafficSource } from '../scenario.js';
import { SimConfigError } from '../errors.js';
import type { Settings } from '../settings.js';
import { enterpriseSubjectIds } from '../engine/subject-classes.js';
import {
  bursts,
  oneShotSubjects,
  oneSubject,
  poisson,
  uniformCost,
  uniformSubjects,
  weightedSubjects,
  zipfWeights,
} from './traffic.js';

const meanCost = (s: Settings) => (1 + s.maxCost) / 2;
/** Requests per second that make `tokensPerSecond` of demand. */
const requestRate = (s: Settings, tokensPerSecond: number) => tokensPerSecond / meanCost(s);

/** `subjects` subjects, each asking load × R spread evenly over the regions, with the given retry behaviour. */
function evenTraffic(
  regions: readonly string[],
  s: Settings,
  retry: TrafficSource['retry'] = { kind: 'none' },
): TrafficSource[] {
  const perRegion = requestRate(s, s.load * s.refillPerSecond * s.subjects) / regions.length;
  return regions.map((_, region) =>
    poisson({
      region,
      rate: () => perRegion,
      maxRate: perRegion,
      endS: s.durationS,
      subjects: uniformSubjects(s.subjects),
      cost: uniformCost(s.maxCost),
      retry,
    }),
  );
}

/**
 * Every subject's demand comes from region `from` until `atS`, then from region `to`: `total` requests per
 * second (by default load × R per subject).
 */
function stepTraffic(
  regions: readonly string[],
  s: Settings,
  total = requestRate(s, s.load * s.refillPerSecond * s.subjects),
): TrafficSource[] {
  const from = 0;
  const to = regions.length > 1 ? 1 : 0;
  return regions.map((_, region) =>
    poisson({
      region,
      rate: (t) => (t < s.shiftAtS ? (region === from ? total : 0) : region === to ? total : 0),
      maxRate: region === from || region === to ? total : 0,
      endS: s.durationS,
      subjects: uniformSubjects(s.subjects),
      cost: uniformCost(s.maxCost),
    }),
  );
}

const plan = (sources: TrafficSource[], extra: Partial<ScenarioPlan> = {}): ScenarioPlan => ({
  sources,
  faults: [],
  shiftsS: [],
  focusSubject: 0,
  ...extra,
});

const window = (atS: number, forS: number, down: TimedFault['fault'], up: TimedFault['fault']) => [
  { atS, fault: down },
  { atS: atS + forS, fault: up },
];

export const uniform: Scenario = {
  name: 'uniform',
  description: 'every subject asks load × R, spread evenly over regions and subjects',
  defaults: { subjects: 20, load: 2 },
  uses: ['load', 'subjects'],
  plan: (regions, s) => plan(evenTraffic(regions, s)),
};

export const zipf: Scenario = {
  name: 'zipf',
  description:
    'subject popularity ~ Zipf(zipfExponent); the top subject asks load × R; each subject sends 70% from its own region',
  defaults: { subjects: 100, load: 4 },
  uses: ['load', 'subjects', 'zipfExponent'],
  plan(regions, s) {
    const n = regions.length;
    const weights = zipfWeights(s.subjects, s.zipfExponent);
    const total = weights.reduce((a, b) => a + b, 0);
    const rate = requestRate(s, (s.load * s.refillPerSecond * total) / weights[0]!);
    const mix = (subject: number, region: number) =>
      n === 1 ? 1 : subject % n === region ? 0.7 : 0.3 / (n - 1);
    return plan(
      regions.map((_, region) => {
        const w = weights.map((x, subject) => x * mix(subject, region));
        const share = w.reduce((a, b) => a + b, 0) / total;
        return poisson({
          region,
          rate: () => rate * share,
          maxRate: rate * share,
          endS: s.durationS,
          subjects: weightedSubjects(w),
          cost: uniformCost(s.maxCost),
        });
      }),
    );
  },
};

export const followTheSun: Scenario = {
  name: 'follow-the-sun',
  description: 'demand (load × R per subject) moves around the regions once per run, peaking in each in turn',
  defaults: { load: 1.5 },
  uses: ['load', 'subjects'],
  plan(regions, s) {
    const n = regions.length;
    const total = requestRate(s, s.load * s.refillPerSecond * s.subjects);
    const weight = (r: number, t: number) =>
      0.05 + Math.pow((1 + Math.cos(2 * Math.PI * (t / s.durationS - r / n))) / 2, 4);
    const rate = (r: number, t: number) => {
      let sum = 0;
      for (let i = 0; i < n; i++) sum += weight(i, t);
      return (total * weight(r, t)) / sum;
    };
    return plan(
      regions.map((_, region) =>
        poisson({
          region,
          rate: (t) => rate(region, t),
          maxRate: total,
          endS: s.durationS,
          subjects: uniformSubjects(s.subjects),
          cost: uniformCost(s.maxCost),
        }),
      ),
    );
  },
};

export const stepShift: Scenario = {
  name: 'step-shift',
  description:
    'all demand (load × R per subject) comes from the first region, then from the second at shiftAtS; ' +
    'utilisation counts from warmupS (120 s): by then the ideal oracle has spent its initial burst',
  defaults: { load: 1.5, warmupS: 120 },
  uses: ['load', 'subjects', 'shiftAtS'],
  plan: (regions, s) => plan(stepTraffic(regions, s), { shiftsS: [s.shiftAtS] }),
};

export const slidingLogShift: Scenario = {
  name: 'sliding-log-shift',
  description:
    'step-shift on a sliding log (C = 60 in any rolling C/R = 300 s): all demand (load × C/window per subject) ' +
    'moves from the first region to the second at shiftAtS; overAdmission is the fullest rolling window / C',
  defaults: {
    kind: 'sliding_log',
    capacity: 60,
    refillPerSecond: 0.2,
    load: 2,
    durationS: 1200,
    shiftAtS: 400,
    borrowing: 'off',
  },
  uses: ['load', 'subjects', 'shiftAtS'],
  plan: (regions, s) => plan(stepTraffic(regions, s), { shiftsS: [s.shiftAtS] }),
};

export const concurrencyShift: Scenario = {
  name: 'concurrency-shift',
  description:
    'step-shift on a concurrency cap (C = 20 slots, leases of C/R = 200 s, slots held holdS = 60 s on average): ' +
    'load × C slots asked per subject move from the first region to the second at shiftAtS; ' +
    'overAdmission is the most slots held at once in all regions / C',
  defaults: {
    kind: 'concurrency',
    capacity: 20,
    refillPerSecond: 0.1,
    holdS: 60,
    // A region's floor must hold one slot (the policy's rule: minShare × C ≥ maxCost).
    minShare: 0.05,
    load: 2,
    durationS: 900,
    shiftAtS: 300,
    borrowing: 'off',
  },
  uses: ['load', 'subjects', 'shiftAtS', 'holdS'],
  plan: (regions, s) =>
    // load × C slots in flight per subject if every one were admitted: C × load / holdS acquisitions per second.
    plan(stepTraffic(regions, s, (s.subjects * s.load * s.capacity) / (s.holdS ?? 1) / meanCost(s)), {
      shiftsS: [s.shiftAtS],
    }),
};

export const minuteBurst: Scenario = {
  name: 'minute-burst',
  description:
    'at every minute boundary each subject bursts load × C requests in every region at once (200 ms)',
  defaults: { subjects: 5, load: 1.5 },
  uses: ['load', 'subjects'],
  plan(regions, s) {
    const sources: TrafficSource[] = [];
    const count = Math.round(requestRate(s, s.load * s.capacity));
    for (let region = 0; region < regions.length; region++) {
      for (let subject = 0; subject < s.subjects; subject++) {
        sources.push(
          bursts({
            region,
            everyS: 60,
            firstS: 0,
            count,
            spreadMs: 200,
            endS: s.durationS,
            subjects: oneSubject(subject),
            cost: uniformCost(s.maxCost),
          }),
        );
      }
    }
    return plan(sources);
  },
};

export const hotTenant: Scenario = {
  name: 'hot-tenant',
  description: 'subject 0 asks load × R from every region; the other subjects ask 0.5 × R each',
  defaults: { subjects: 20, load: 10 },
  uses: ['load', 'subjects'],
  plan(regions, s) {
    const n = regions.length;
    const hot = requestRate(s, s.load * s.refillPerSecond) / n;
    const rest = requestRate(s, 0.5 * s.refillPerSecond * s.subjects) / n;
    const sources = regions.flatMap((_, region) => [
      poisson({
        region,
        rate: () => hot,
        maxRate: hot,
        endS: s.durationS,
        subjects: oneSubject(0),
        cost: uniformCost(s.maxCost),
      }),
      poisson({
        region,
        rate: () => rest,
        maxRate: rest,
        endS: s.durationS,
        subjects: uniformSubjects(s.subjects, 1),
        cost: uniformCost(s.maxCost),
      }),
    ]);
    return plan(sources);
  },
};

/**
 * Home region of each of `count` subjects, spread by `split` (weights by region, in order; regions past the list
 * get none), by largest remainder so the counts are exact and the same for every seed: 10 subjects at 70/20/10
 * are homed 7, 2 and 1.
 */
export function homesOf(count: number, split: string, regionCount: number): number[] {
  const weights = split.split('/').map(Number).slice(0, regionCount);
  const total = weights.reduce((a, b) => a + b, 0);
  if (!(total > 0)) throw new SimConfigError(`homeSplit ${split} gives no region any subject`);
  const exact = weights.map((w) => (count * w) / total);
  const counts = exact.map(Math.floor);
  let left = count - counts.reduce((a, b) => a + b, 0);
  const order = exact
    .map((x, r) => ({ r, rest: x - Math.floor(x) }))
    .sort((a, b) => b.rest - a.rest || a.r - b.r);
  for (const { r } of order) {
    if (left-- <= 0) break;
    counts[r]!++;
  }
  return counts.flatMap((c, r) => Array.from({ length: c }, () => r));
}

/**
 * Each subject asks load × its own rate from its home region only: R, or R × enterpriseFactor for the enterprise
 * subjects (the last enterpriseSubjects, engine/subject-classes.ts).
 */
function homedPlan(regions: readonly string[], s: Settings): ScenarioPlan {
  const homes = homesOf(s.subjects, s.homeSplit, regions.length);
  const enterprise = new Set(enterpriseSubjectIds(s));
  const sources: TrafficSource[] = [];
  homes.forEach((region, subject) => {
    const rate = requestRate(
      s,
      s.load * s.refillPerSecond * (enterprise.has(subject) ? (s.enterpriseFactor ?? 1) : 1),
    );
    sources.push(
      poisson({
        region,
        rate: () => rate,
        maxRate: rate,
        endS: s.durationS,
        subjects: oneSubject(subject),
        cost: uniformCost(s.maxCost),
      }),
    );
  });
  // The chart follows a subject of the least populated home that has one.
  return plan(sources, { focusSubject: homes.length - 1 });
}

export const homedTenants: Scenario = {
  name: 'homed-tenants',
  description:
    'each subject asks load × R from its home region only; homes spread over the regions by homeSplit (70/20/10)',
  defaults: { subjects: 10, load: 1.5 },
  uses: ['load', 'subjects', 'homeSplit', 'enterpriseSubjects', 'enterpriseFactor'],
  plan: homedPlan,
};

/** homed-tenants with its enterprise class on by default. */
export const tieredTenants: Scenario = {
  ...homedTenants,
  name: 'tiered-tenants',
  description:
    'homed-tenants with a 10× enterprise class: the last 2 subjects (homed in the smaller regions) have 10 C and 10 R and ask load × 10 R',
  defaults: { ...homedTenants.defaults, enterpriseSubjects: 2, enterpriseFactor: 10 },
};

export const noisyNeighbour: Scenario = {
  name: 'noisy-neighbour',
  description:
    'subject 0 asks load × R (10×) from the first region only; the other subjects ask quietLoad × R each from the other regions',
  defaults: { subjects: 10, load: 10 },
  uses: ['load', 'subjects', 'quietLoad'],
  plan(regions, s) {
    const n = regions.length;
    const noisy = requestRate(s, s.load * s.refillPerSecond);
    const quiet = requestRate(s, s.quietLoad * s.refillPerSecond * Math.max(0, s.subjects - 1));
    const sources = [
      poisson({
        region: 0,
        rate: () => noisy,
        maxRate: noisy,
        endS: s.durationS,
        subjects: oneSubject(0),
        cost: uniformCost(s.maxCost),
      }),
    ];
    if (s.subjects > 1) {
      // With one region the quiet subjects share it with the noisy one.
      const quietRegions = n === 1 ? [0] : regions.map((_, r) => r).slice(1);
      for (const region of quietRegions)
        sources.push(
          poisson({
            region,
            rate: () => quiet / quietRegions.length,
            maxRate: quiet / quietRegions.length,
            endS: s.durationS,
            subjects: uniformSubjects(s.subjects - 1, 1),
            cost: uniformCost(s.maxCost),
          }),
        );
    }
    // The chart follows a quiet subject: what the noisy one must not take from it.
    return plan(sources, { focusSubject: s.subjects > 1 ? 1 : 0 });
  },
};

export const coldStart: Scenario = {
  name: 'cold-start',
  description:
    'even traffic (load × R per subject) stops at idleAtS and resumes identically in every region idleForS later',
  defaults: { load: 1.5 },
  uses: ['load', 'subjects', 'idleAtS', 'idleForS'],
  plan(regions, s) {
    const perRegion = requestRate(s, s.load * s.refillPerSecond * s.subjects) / regions.length;
    const resume = s.idleAtS + s.idleForS;
    const on = (t: number) => t < s.idleAtS || t >= resume;
    return plan(
      regions.map((_, region) =>
        poisson({
          region,
          rate: (t) => (on(t) ? perRegion : 0),
          maxRate: perRegion,
          endS: s.durationS,
          subjects: uniformSubjects(s.subjects),
          cost: uniformCost(s.maxCost),
        }),
      ),
      // Convergence counts from the moment demand resumes.
      { shiftsS: resume < s.durationS ? [resume] : [] },
    );
  },
};

/** Subject ids of one-shot identities start here, far above the regular subjects. */
export const ONE_SHOT_FIRST_SUBJECT = 1_000_000;

export const oneShotIdentities: Scenario = {
  name: 'one-shot-identities',
  description:
    'oneShotRate new identities per second, one request each, beside regular subjects at load × R: live keys must level off after the idle TTL',
  defaults: { subjects: 5, load: 1 },
  uses: ['load', 'subjects', 'oneShotRate'],
  plan(regions, s) {
    const fresh = oneShotSubjects(ONE_SHOT_FIRST_SUBJECT);
    const perRegion = s.oneShotRate / regions.length;
    const flood = regions.map((_, region) =>
      poisson({
        region,
        rate: () => perRegion,
        maxRate: perRegion,
        endS: s.durationS,
        subjects: fresh,
        cost: uniformCost(s.maxCost),
      }),
    );
    return plan([...evenTraffic(regions, s), ...flood]);
  },
};

export const ignoreRetryAfter: Scenario = {
  name: 'ignore-retry-after',
  description:
    'subjects ask load × R; denied clients retry every retryIntervalMs (up to maxRetries), ignoring Retry-After',
  defaults: { load: 1.5 },
  uses: ['load', 'subjects', 'retryIntervalMs', 'maxRetries'],
  plan: (regions, s) =>
    plan(
      evenTraffic(regions, s, { kind: 'ignore', intervalMs: s.retryIntervalMs, maxRetries: s.maxRetries }),
    ),
};

export const coordinatorCrash: Scenario = {
  name: 'coordinator-crash',
  description:
    'step-shift traffic (shift at shiftAtS); the leading coordinator is down from faultAtS for faultForS; a standby takes over standbyAfterS later (its leader lease; 0: none) (matters to dynamic strategies)',
  defaults: { load: 1.5, shiftAtS: 100, faultAtS: 120, standbyAfterS: 10 },
  uses: ['load', 'subjects', 'shiftAtS', 'faultAtS', 'faultForS', 'standbyAfterS'],
  plan: (regions, s) =>
    plan(stepTraffic(regions, s), {
      // Recovery is measured after the demand shift and again after the coordinator returns.
      shiftsS: s.faultAtS + s.faultForS < s.durationS ? [s.shiftAtS, s.faultAtS + s.faultForS] : [s.shiftAtS],
      faults: window(s.faultAtS, s.faultForS, { kind: 'coordinator-down' }, { kind: 'coordinator-up' }),
    }),
};

export const regionPartition: Scenario = {
  name: 'region-partition',
  description: 'even traffic; the last region is cut off from every other node from faultAtS for faultForS',
  defaults: { load: 1.5 },
  uses: ['load', 'subjects', 'faultAtS', 'faultForS'],
  plan(regions, s) {
    const region = regions.length - 1;
    return plan(evenTraffic(regions, s), {
      // Convergence here is recovery: from the moment the partition heals.
      shiftsS: s.faultAtS + s.faultForS < s.durationS ? [s.faultAtS + s.faultForS] : [],
      faults: window(s.faultAtS, s.faultForS, { kind: 'partition', region }, { kind: 'heal', region }),
    });
  },
};

export const redisFailover: Scenario = {
  name: 'redis-failover',
  description:
    "even traffic at load × R; the first region's Redis fails over at faultAtS to a replica that lost failoverLagS of writes (or everything)",
  defaults: { load: 3, faultAtS: 30, failoverLagS: 10 },
  uses: ['load', 'subjects', 'faultAtS', 'failoverLagS', 'failoverReset'],
  plan: (regions, s) =>
    plan(evenTraffic(regions, s), {
      // Convergence here is recovery from the failover.
      shiftsS: [s.faultAtS],
      faults: [
        {
          atS: s.faultAtS,
          fault: { kind: 'redis-failover', region: 0, reset: s.failoverReset, lostWritesS: s.failoverLagS },
        },
      ],
    }),
};

/** Every scenario, in the order `--help` lists them. */
export const scenarios: readonly Scenario[] = [
  uniform,
  zipf,
  followTheSun,
  stepShift,
  minuteBurst,
  hotTenant,
  homedTenants,
  tieredTenants,
  noisyNeighbour,
  coldStart,
  oneShotIdentities,
  ignoreRetryAfter,
  coordinatorCrash,
  regionPartition,
  redisFailover,
  slidingLogShift,
  concurrencyShift,
];

export function findScenario(name: string): Scenario | undefined {
  return scenarios.find((s) => s.name === name);
}
