/**
 * One run: a scenario's arrivals, offered to one strategy and, in the same instant, to the ideal oracle, under a
 * virtual clock, with the scenario's faults injected; returns the metrics and the series for the charts.
 */
import { isLogKind, parsePolicy, type Policy } from '../../core/policy.js';
import { SimConfigError } from '../errors.js';
import { convergenceSeconds } from '../metrics/convergence.js';
import { Recorder, roundMetric, sortedRecord, type RunSeries } from '../metrics/recorder.js';
import { sharesSettledSeconds } from '../metrics/share-settling.js';
import type { StrategyResult } from '../metrics/result.js';
import type { Fault, Scenario, TrafficSource } from '../scenario.js';
import { logWindowOf, REGION_NAMES, type Settings } from '../settings.js';
import {
  PENDING,
  type Outcome,
  type SimRequest,
  type StrategyContext,
  type StrategyDefinition,
} from '../strategy.js';
import { BucketSizing } from './bucket-sizing.js';
import { decideLog } from './log-decision.js';
import { EventQueue, type SimEvent } from './event-queue.js';
import { buildLinks } from './links.js';
import { Network } from './network.js';
import { Random } from './random.js';
import { RegionStore, type StoreSnapshot } from './region-store.js';
import { enterpriseClassFields, SubjectPolicies } from './subject-classes.js';

/** A subject counts for the worst-subject figure once the oracle admitted it this many largest requests. */
export const WORST_SUBJECT_MIN_REQUESTS = 10;

/** Virtual seconds between sweeps of expired keys (the peak-keys measure). */
const SWEEP_EVERY_S = 10;

export interface RunSpec {
  scenario: Scenario;
  strategy: StrategyDefinition;
  regionCount: number;
  seed: number;
  settings: Settings;
  sweep?: { setting: string; value: number | string } | undefined;
  /** Called as virtual time advances, with the fraction of the run done. */
  onProgress?: ((fraction: number) => void) | undefined;
}

export interface RunOutput {
  result: StrategyResult;
  series: RunSeries;
  /** Requests decided by the strategy (the oracle decides each one too, not counted). */
  decisions: number;
}

class Request implements SimRequest {
  idealAllowed = false;
  constructor(
    readonly id: number,
    readonly at: number,
    readonly region: number,
    readonly subject: number,
    readonly cost: number,
    readonly attempt: number,
    readonly source: number,
    readonly holdUs: number | undefined = undefined,
  ) {}
}

/** The regions of a run. */
export function regionsOf(count: number): string[] {
  if (!(Number.isInteger(count) && count >= 1 && count <= REGION_NAMES.length))
    throw new SimConfigError(`--regions must be an integer in [1, ${REGION_NAMES.length}]`);
  return REGION_NAMES.slice(0, count);
}

/** The policy a strategy enforces in a run, parsed by core/policy.ts. */
export function simPolicy(
  settings: Settings,
  strategy: StrategyDefinition,
  regions: readonly string[],
): Policy {
  const homeRegion = settings.homeRegion ?? regions[0]!;
  if (!regions.includes(homeRegion))
    throw new SimConfigError(
      `homeRegion ${homeRegion} is not one of this run's regions (${regions.join(', ')})`,
    );
  const window = logWindowOf(settings);
  const parsed = parsePolicySafely({
    name: 'sim',
    capacity: settings.capacity,
    // A log kind keeps C over a window of C / R seconds; its rate is derived from them (core/policy.ts).
    ...(settings.kind === 'sliding_log'
      ? { kind: 'sliding_log', windowSeconds: window }
      : settings.kind === 'concurrency'
        ? { kind: 'concurrency', leaseSeconds: window }
        : { refillPerSecond: settings.refillPerSecond }),
    maxCost: settings.maxCost,
    mode: strategy.mode,
    homeRegion,
    onStoreFailure: settings.onStoreFailure,
    // The floor of moving shares is the policy's own setting; strategies that never move shares leave it unset.
    ...(strategy.uses.includes('minShare') ? { minShare: settings.minShare } : {}),
    // Subject classes: the enterprise subjects' capacity and refill (engine/subject-classes.ts).
    ...enterpriseClassFields(settings),
  });
  return parsed;
}

/** Each subject's own limits when the policy has classes (over-admission is measured against them). */
function classLimits(policy: Policy): ((subject: number) => Policy) | undefined {
  if (policy.subjects === undefined) return undefined;
  const policies = new SubjectPolicies(policy);
  return (subject) => policies.of(subject);
}

function parsePolicySafely(input: Parameters<typeof parsePolicy>[0]): Policy {
  try {
    return parsePolicy(input);
  } catch (error) {
    throw new SimConfigError(`the simulated policy is invalid: ${(error as Error).message}`);
  }
}

/** Check what can be checked before running: regions, the policy, fault times, links. Throws SimConfigError. */
export function validateRun(spec: RunSpec): { regions: string[]; policy: Policy } {
  const { scenario, strategy, settings } = spec;
  const regions = regionsOf(spec.regionCount);
  const policy = simPolicy(settings, strategy, regions);
  for (const key of ['shiftAtS', 'faultAtS'] as const) {
    if (scenario.uses.includes(key) && settings[key] >= settings.durationS)
      throw new SimConfigError(
        `${scenario.name}: ${key} (${settings[key]}) must be before the end of the run (durationS ${settings.durationS})`,
      );
  }
  if (isLogKind(policy.kind) && scenario.uses.includes('failoverReset'))
    throw new SimConfigError(
      `${scenario.name}: a failover of the simulated Redis copies token buckets only; run it with kind token_bucket`,
    );
  if (settings.warmupS >= settings.durationS) {
    throw new SimConfigError(
      `warmupS (${settings.warmupS}) must be before the end of the run (durationS ${settings.durationS}): nothing would be measured`,
    );
  }
  buildLinks(
    regions,
    regions.map((_, i) => i),
    settings,
  );
  strategy.validate?.(settings, regions, policy);
  return { regions, policy };
}

export function runSimulation(spec: RunSpec): RunOutput {
  const { scenario, strategy: definition, settings } = spec;
  const { regions, policy } = validateRun(spec);
  const home = regions.indexOf(policy.homeRegion!);
  const plan = scenario.plan(regions, settings);
  const endUs = settings.durationS * 1e6;

  const queue = new EventQueue();
  const root = new Random(spec.seed, scenario.name);
  const n = regions.length;
  const coordinator = n;
  const locations = [...regions.map((_, i) => i), home];
  const network = new Network(
    [...regions, 'coordinator'],
    buildLinks(regions, locations, settings),
    queue,
    root.fork('network'),
  );
  const stores = regions.map((name) => new RegionStore(name));
  const oracle = new RegionStore('ideal');
  const oracleSizing = new BucketSizing(policy, 1);
  const recorder = new Recorder(settings.durationS, settings.binS, plan.focusSubject, settings.warmupS);
  const strategy = definition.create();
  const sources: readonly TrafficSource[] = plan.sources;
  let nextId = 0;
  let unfinished = 0;

  const complete = (request: Request, outcome: Outcome): void => {
    unfinished--;
    recorder.completed(request, outcome, request.idealAllowed, queue.now);
    if (outcome.slot !== undefined) hold(request, outcome.slot, outcome.decidedAt);
    if (outcome.allowed) return;
    const retry = sources[request.source]!.retry;
    if (retry.kind === 'none' || request.attempt >= retry.maxRetries) return;
    let waitUs: number;
    if (retry.kind === 'ignore') waitUs = Math.round(retry.intervalMs * 1000);
    else if (outcome.retryAfterMs >= 0) waitUs = Math.max(1, outcome.retryAfterMs * 1000);
    else return;
    const at = queue.now + waitUs;
    if (at >= endUs) return;
    queue.at(at, () =>
      offer(
        new Request(
          nextId++,
          at,
          request.region,
          request.subject,
          request.cost,
          request.attempt + 1,
          request.source,
          request.holdUs,
        ),
      ),
    );
  };

  // Kind concurrency: the client holds an admitted slot for its hold time, then releases it where it was taken;
  // the lease (the log's window) frees it by itself at the latest. Over-admission counts the slots held.
  const leaseUs = (logWindowOf(settings) ?? 0) * 1e6;
  const hold = (request: Request, slot: NonNullable<Outcome['slot']>, decidedAt: number): void => {
    const releaseAt = queue.now + (request.holdUs ?? 0);
    recorder.held.add(request.subject, decidedAt, Math.min(releaseAt, decidedAt + leaseUs), request.cost);
    queue.at(releaseAt, () => {
      slot.store.releaseSlots(
        request.subject,
        { stamp: slot.stamp, seq: slot.seq, cost: request.cost },
        queue.now,
      );
    });
  };
  const logKind = isLogKind(policy.kind);
  const offer = (request: Request): void => {
    unfinished++;
    if (logKind) {
      const ideal = decideLog(policy, oracle, request.subject, request.cost, 1, request.at).outcome;
      request.idealAllowed = ideal.allowed;
      const slot = ideal.slot;
      if (slot !== undefined)
        queue.at(request.at + (request.holdUs ?? 0), () => {
          oracle.releaseSlots(
            request.subject,
            { stamp: slot.stamp, seq: slot.seq, cost: request.cost },
            queue.now,
          );
        });
    } else
      request.idealAllowed = oracle.decide(
        request.subject,
        oracleSizing.check(request.cost, request.subject),
        request.at,
      ).allowed;
    recorder.offered(request, request.idealAllowed);
    const outcome = strategy.decide(request);
    if (outcome !== PENDING) complete(request, outcome);
  };

  const ctx: StrategyContext = {
    regions,
    coordinator,
    home,
    policy,
    settings,
    network,
    stores,
    random: root.fork(`strategy/${definition.name}`),
    now: () => queue.now,
    at: (time, fn) => queue.at(time, fn),
    complete: (request, outcome) => complete(request as Request, outcome),
    count: (counter, by = 1) => recorder.count(counter, by),
    sharesInForce: (unit, shares) => recorder.sharesInForce(unit, shares, queue.now),
  };
  try {
    strategy.start(ctx);
  } catch (error) {
    if (error instanceof RangeError) throw new SimConfigError(`${definition.name}: ${error.message}`);
    throw error;
  }

  sources.forEach((source, index) => {
    const random = root.fork(`source/${index}`);
    // Hold times come from a stream of their own: the arrivals stay those of the token-bucket runs.
    const holds = settings.kind === 'concurrency' ? root.fork(`hold/${index}`) : undefined;
    const holdS = settings.holdS ?? 0;
    const first = source.nextArrival(0, random);
    if (!(first < endUs)) return;
    const event: SimEvent = {
      at: first,
      seq: 0,
      run() {
        const at = event.at;
        offer(
          new Request(
            nextId++,
            at,
            source.region,
            source.subject(at, random),
            source.cost(random),
            0,
            index,
            holds === undefined ? undefined : Math.max(1, Math.round(holds.exponential(holdS * 1e6))),
          ),
        );
        const next = source.nextArrival(at, random);
        if (next < endUs) {
          event.at = next;
          queue.push(event);
        }
      },
    };
    queue.push(event);
  });

  const failover = new Map<number, StoreSnapshot>();
  for (const { atS, fault } of plan.faults) {
    if (fault.kind === 'redis-failover' && fault.reset === 'snapshot') {
      queue.at(Math.max(0, atS - fault.lostWritesS) * 1e6, () => {
        failover.set(fault.region, stores[fault.region]!.snapshot());
      });
    }
    queue.at(atS * 1e6, () => {
      applyFault(fault);
      strategy.onFault?.(fault);
    });
  }

  function applyFault(fault: Fault): void {
    recorder.count(`fault:${fault.kind}`);
    switch (fault.kind) {
      case 'coordinator-down':
      case 'coordinator-up':
        network.setDown(coordinator, fault.kind === 'coordinator-down');
        return;
      case 'partition':
      case 'heal':
        for (let a = 0; a < locations.length; a++)
          for (let b = a + 1; b < locations.length; b++)
            if ((locations[a] === fault.region) !== (locations[b] === fault.region))
              network.setCut(a, b, fault.kind === 'partition');
        return;
      case 'redis-failover': {
        const snapshot = failover.get(fault.region);
        if (fault.reset === 'snapshot' && snapshot !== undefined) stores[fault.region]!.restore(snapshot);
        else stores[fault.region]!.clear();
        return;
      }
    }
  }

  const binUs = settings.binS * 1e6;
  const bins = recorder.series.admitted.length;
  const tick = (bin: number) => {
    recorder.sampleShares(strategy.shares(), queue.now);
    spec.onProgress?.(Math.min(1, (bin * binUs) / endUs));
    if ((bin * settings.binS) % SWEEP_EVERY_S === 0) {
      for (const store of stores) store.sweep(queue.now);
      oracle.sweep(queue.now);
    }
    if (bin + 1 < bins) queue.at((bin + 1) * binUs, () => tick(bin + 1));
  };
  queue.at(0, () => tick(0));

  // Past the end, only what is in flight finishes (forwarded decisions time out by then); timers stop.
  const stopUs = endUs + Math.round(settings.forwardTimeoutMs * 1000) + 1;
  while (queue.peekTime() <= stopUs) queue.pop()!.run();
  for (const store of stores) store.sweep(queue.now);
  strategy.finish?.();
  recorder.closeShares();
  if (unfinished > 0) recorder.count('unfinished', unfinished);
  spec.onProgress?.(1);

  const seconds = settings.durationS;
  const counts = network.counts;
  const result: StrategyResult = {
    scenario: scenario.name,
    strategy: definition.name,
    seed: spec.seed,
    regions,
    ...(spec.sweep === undefined ? {} : { sweep: spec.sweep }),
    ...(logKind
      ? recorder.kindOverAdmission(policy.kind, settings.capacity, leaseUs)
      : recorder.overAdmission(settings.capacity, settings.refillPerSecond, classLimits(policy))),
    // Utilisation and the false rates count requests that arrived after the warm-up (settings.warmupS).
    utilisation:
      recorder.measured.idealAdmittedCost === 0
        ? null
        : roundMetric(recorder.measured.admittedCost / recorder.measured.idealAdmittedCost),
    utilisationWholeRun:
      recorder.idealAdmittedCost === 0
        ? null
        : roundMetric(recorder.admittedCost / recorder.idealAdmittedCost),
    worstSubject: recorder.worstSubject(WORST_SUBJECT_MIN_REQUESTS * settings.maxCost),
    falseDenialRate:
      recorder.measured.requests === 0
        ? 0
        : roundMetric(recorder.measured.falseDenials / recorder.measured.requests),
    falseAdmissionRate:
      recorder.measured.requests === 0
        ? 0
        : roundMetric(recorder.measured.falseAdmissions / recorder.measured.requests),
    convergenceSeconds: convergenceSeconds(recorder.series.admitted, recorder.series.ideal, plan.shiftsS, {
      binS: settings.binS,
      windowBins: Math.max(1, Math.round(settings.convergenceWindowS / settings.binS)),
      tolerance: settings.convergenceTolerance,
      slack: settings.maxCost,
      fullBins: Math.floor(settings.durationS / settings.binS),
      holdBins: Math.ceil(settings.convergenceHoldS / settings.binS),
    }),
    sharesSettledSeconds: sharesSettledSeconds(recorder.series.shares, plan.shiftsS, {
      binS: settings.binS,
      fullBins: Math.floor(settings.durationS / settings.binS),
      holdBins: Math.ceil(settings.convergenceHoldS / settings.binS),
    }),
    controlMessagesPerSecond: roundMetric(counts.control / seconds),
    forwardedMessagesPerSecond: roundMetric(counts.data / seconds),
    ...recorder.latencyMs(),
    requests: recorder.requests,
    arrivals: recorder.requests - recorder.retries,
    retries: recorder.retries,
    forwarded: recorder.forwarded,
    admitted: recorder.admitted,
    admittedCost: recorder.admittedCost,
    denied: recorder.denied,
    idealAdmitted: recorder.idealAdmitted,
    idealAdmittedCost: recorder.idealAdmittedCost,
    falseDenials: recorder.falseDenials,
    falseAdmissions: recorder.falseAdmissions,
    degraded: sortedRecord(recorder.degraded),
    counters: sortedRecord(recorder.counters),
    network: { control: counts.control, data: counts.data, lost: counts.lost, dropped: counts.dropped },
    peakKeys: Object.fromEntries(stores.map((s) => [s.name, s.peakKeys])),
    maxShareSum: recorder.maxShareSum,
    shareSumAboveOneS: recorder.maxShareSum === null ? null : roundMetric(recorder.shareSumAboveOneUs / 1e6),
    durationS: seconds,
    settings: Object.fromEntries(
      Object.entries(settings).filter((e): e is [string, number | string] => e[1] !== undefined),
    ),
  };
  return { result, series: recorder.series, decisions: recorder.requests };
}
