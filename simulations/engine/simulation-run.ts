/**
 * The state and steps of one run (engine/run.ts's runSimulation calls them in order): the virtual clock, the
 * simulated network and stores, the ideal oracle, the strategy under test, the traffic, the faults and the recorder
 * that measures it all.
 */
import { isLogKind, type Policy } from '../../core/policy/policy.js';
import { kindOf } from '../../core/kinds/index.js';
import { SimConfigError } from '../errors.js';
import { convergenceSeconds } from '../metrics/convergence.js';
import { Recorder, roundMetric, sortedRecord, type RunSeries } from '../metrics/recorder.js';
import { sharesSettledSeconds } from '../metrics/share-settling.js';
import type { StrategyResult } from '../metrics/result.js';
import type { Fault, Scenario, TrafficSource } from '../scenario.js';
import { logWindowOf, type Settings } from '../settings.js';
import {
  PENDING,
  type Outcome,
  type SimRequest,
  type Strategy,
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
import { SubjectPolicies } from './subject-classes.js';

/** A subject counts for the worst-subject figure once the oracle admitted it this many largest requests. */
export const WORST_SUBJECT_MIN_REQUESTS = 10;

/** Virtual seconds between sweeps of expired keys (the peak-keys measure). */
const SWEEP_EVERY_S = 10;

/** What to run: one scenario under one strategy, with its settings and seed. */
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

/** What a run returns: its metrics and the series for the charts. */
export interface RunOutput {
  result: StrategyResult;
  series: RunSeries;
  /** Requests decided by the strategy (the oracle decides each one too, not counted). */
  decisions: number;
}

/** One attempt of a client's request (a retry is a new Request with `attempt` one more). */
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

/** Each subject's own limits when the policy has classes (over-admission is measured against them). */
function classLimits(policy: Policy): ((subject: number) => Policy) | undefined {
  if (policy.subjects === undefined) return undefined;
  const policies = new SubjectPolicies(policy);
  return (subject) => policies.of(subject);
}

/**
 * The state of one run: the virtual clock, the simulated network and stores, the ideal oracle, the strategy under
 * test and the recorder that measures it. Each public method is one step; runSimulation calls each once, in order.
 * A request flows `#offer` (the oracle, then the strategy) → `#complete` (now or later) → `#hold` / `#retry`.
 */
export class SimulationRun {
  readonly #spec: RunSpec;
  readonly #settings: Settings;
  readonly #regions: string[];
  readonly #policy: Policy;
  readonly #logKind: boolean;
  readonly #home: number;
  readonly #plan: ReturnType<Scenario['plan']>;
  readonly #endUs: number;
  readonly #queue = new EventQueue();
  readonly #root: Random;
  /** The coordinator's network location: one past the regions. */
  readonly #coordinator: number;
  /** Each network location's region: the regions, then the coordinator's (home) region. */
  readonly #locations: number[];
  readonly #network: Network;
  readonly #stores: RegionStore[];
  /** The ideal oracle: one store that sees every request at once, with no network. */
  readonly #oracle = new RegionStore('ideal');
  readonly #oracleSizing: BucketSizing;
  readonly #recorder: Recorder;
  readonly #strategy: Strategy;
  readonly #sources: readonly TrafficSource[];
  /** Kind concurrency: how long a slot stays taken at most (the log's window), µs; 0 for other kinds. */
  readonly #leaseUs: number;
  /** Snapshots taken `lostWritesS` before a `redis-failover` with reset `snapshot`, by region. */
  readonly #failover = new Map<number, StoreSnapshot>();
  #nextId = 0;
  /** Requests offered and not yet completed. */
  #unfinished = 0;

  constructor(spec: RunSpec, { regions, policy }: { regions: string[]; policy: Policy }) {
    const { scenario, settings } = spec;
    this.#spec = spec;
    this.#settings = settings;
    this.#regions = regions;
    this.#policy = policy;
    this.#logKind = isLogKind(policy.kind);
    this.#home = regions.indexOf(policy.homeRegion!);
    this.#plan = scenario.plan(regions, settings);
    this.#endUs = settings.durationS * 1e6;
    this.#root = new Random(spec.seed, scenario.name);
    this.#coordinator = regions.length;
    this.#locations = [...regions.map((_, i) => i), this.#home];
    this.#network = new Network(
      [...regions, 'coordinator'],
      buildLinks(regions, this.#locations, settings),
      this.#queue,
      this.#root.fork('network'),
    );
    this.#stores = regions.map((name) => new RegionStore(name));
    this.#oracleSizing = new BucketSizing(policy, 1);
    this.#recorder = new Recorder(
      settings.durationS,
      settings.binS,
      this.#plan.focusSubject,
      settings.warmupS,
    );
    this.#strategy = spec.strategy.create();
    this.#sources = this.#plan.sources;
    this.#leaseUs = (logWindowOf(settings) ?? 0) * 1e6;
  }

  /** Give the strategy its context (network, stores, clock, recorder hooks) and let it schedule its timers. */
  startStrategy(): void {
    const queue = this.#queue;
    const recorder = this.#recorder;
    const ctx: StrategyContext = {
      regions: this.#regions,
      coordinator: this.#coordinator,
      home: this.#home,
      policy: this.#policy,
      settings: this.#settings,
      network: this.#network,
      stores: this.#stores,
      random: this.#root.fork(`strategy/${this.#spec.strategy.name}`),
      now: () => queue.now,
      at: (time, fn) => queue.at(time, fn),
      complete: (request, outcome) => this.#complete(request as Request, outcome),
      count: (counter, by = 1) => recorder.count(counter, by),
      sharesInForce: (unit, shares) => recorder.sharesInForce(unit, shares, queue.now),
    };
    try {
      this.#strategy.start(ctx);
    } catch (error) {
      if (error instanceof RangeError)
        throw new SimConfigError(`${this.#spec.strategy.name}: ${error.message}`);
      throw error;
    }
  }

  /**
   * Each traffic source's arrivals, one event per source that reschedules itself: its own random stream, so a
   * source's arrivals never depend on what else happens in the run.
   */
  scheduleArrivals(): void {
    const endUs = this.#endUs;
    const queue = this.#queue;
    const root = this.#root;
    const settings = this.#settings;
    this.#sources.forEach((source, index) => {
      const random = root.fork(`source/${index}`);
      // Hold times come from a stream of their own: the arrivals stay those of the token-bucket runs.
      const holds =
        settings.kind !== undefined && kindOf(settings.kind).leases ? root.fork(`hold/${index}`) : undefined;
      const holdS = settings.holdS ?? 0;
      const first = source.nextArrival(0, random);
      if (!(first < endUs)) return;
      const event: SimEvent = {
        at: first,
        seq: 0,
        run: () => {
          const at = event.at;
          this.#offer(
            new Request(
              this.#nextId++,
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
  }

  /** The scenario's faults at their times (and, for a failover from a snapshot, the snapshot before it). */
  scheduleFaults(): void {
    for (const { atS, fault } of this.#plan.faults) {
      if (fault.kind === 'redis-failover' && fault.reset === 'snapshot') {
        this.#queue.at(Math.max(0, atS - fault.lostWritesS) * 1e6, () => {
          this.#failover.set(fault.region, this.#stores[fault.region]!.snapshot());
        });
      }
      this.#queue.at(atS * 1e6, () => {
        this.#applyFault(fault);
        this.#strategy.onFault?.(fault);
      });
    }
  }

  /** One sample per bin: the strategy's shares, the progress, and every `SWEEP_EVERY_S` a sweep of expired keys. */
  scheduleSampling(): void {
    this.#queue.at(0, () => this.#sample(0));
  }

  /** Run the clock past the end: only what is in flight finishes (forwarded decisions time out by then). */
  runToEnd(): void {
    const queue = this.#queue;
    const stopUs = this.#endUs + Math.round(this.#settings.forwardTimeoutMs * 1000) + 1;
    while (queue.peekTime() <= stopUs) queue.pop()!.run();
    for (const store of this.#stores) store.sweep(queue.now);
    this.#strategy.finish?.();
    this.#recorder.closeShares();
    if (this.#unfinished > 0) this.#recorder.count('unfinished', this.#unfinished);
    this.#spec.onProgress?.(1);
  }

  /** The run's metrics (metrics/result.ts) and the series for the charts. */
  summarise(): RunOutput {
    const spec = this.#spec;
    const settings = this.#settings;
    const recorder = this.#recorder;
    const plan = this.#plan;
    const policy = this.#policy;
    const seconds = settings.durationS;
    const counts = this.#network.counts;
    const result: StrategyResult = {
      scenario: spec.scenario.name,
      strategy: spec.strategy.name,
      seed: spec.seed,
      regions: this.#regions,
      ...(spec.sweep === undefined ? {} : { sweep: spec.sweep }),
      ...(this.#logKind
        ? recorder.kindOverAdmission(policy.kind, settings.capacity, this.#leaseUs)
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
      peakKeys: Object.fromEntries(this.#stores.map((s) => [s.name, s.peakKeys])),
      maxShareSum: recorder.maxShareSum,
      shareSumAboveOneS:
        recorder.maxShareSum === null ? null : roundMetric(recorder.shareSumAboveOneUs / 1e6),
      durationS: seconds,
      settings: Object.fromEntries(
        Object.entries(settings).filter((e): e is [string, number | string] => e[1] !== undefined),
      ),
    };
    return { result, series: recorder.series, decisions: recorder.requests };
  }

  /** A request arrives: the oracle decides it first (the reference), then the strategy, now or later. */
  #offer(request: Request): void {
    this.#unfinished++;
    request.idealAllowed = this.#decideIdeal(request);
    this.#recorder.offered(request, request.idealAllowed);
    const outcome = this.#strategy.decide(request);
    if (outcome !== PENDING) this.#complete(request, outcome);
  }

  /** What the ideal oracle decides; a concurrency slot it takes is released after the request's hold time. */
  #decideIdeal(request: Request): boolean {
    if (!this.#logKind)
      return this.#oracle.decide(
        request.subject,
        this.#oracleSizing.check(request.cost, request.subject),
        request.at,
      ).allowed;
    const ideal = decideLog(this.#policy, this.#oracle, request.subject, request.cost, 1, request.at).outcome;
    const slot = ideal.slot;
    if (slot !== undefined)
      this.#queue.at(request.at + (request.holdUs ?? 0), () => {
        this.#oracle.releaseSlots(
          request.subject,
          { stamp: slot.stamp, seq: slot.seq, cost: request.cost },
          this.#queue.now,
        );
      });
    return ideal.allowed;
  }

  /** The strategy decided: record it, hold an admitted slot, and retry a denial as the source's client would. */
  #complete(request: Request, outcome: Outcome): void {
    this.#unfinished--;
    this.#recorder.completed(request, outcome, request.idealAllowed, this.#queue.now);
    if (outcome.slot !== undefined) this.#hold(request, outcome.slot, outcome.decidedAt);
    if (!outcome.allowed) this.#retry(request, outcome);
  }

  /**
   * Kind concurrency: the client holds an admitted slot for its hold time, then releases it where it was taken;
   * the lease (the log's window) frees it by itself at the latest. Over-admission counts the slots held.
   */
  #hold(request: Request, slot: NonNullable<Outcome['slot']>, decidedAt: number): void {
    const queue = this.#queue;
    const releaseAt = queue.now + (request.holdUs ?? 0);
    this.#recorder.held.add(
      request.subject,
      decidedAt,
      Math.min(releaseAt, decidedAt + this.#leaseUs),
      request.cost,
    );
    queue.at(releaseAt, () => {
      slot.store.releaseSlots(
        request.subject,
        { stamp: slot.stamp, seq: slot.seq, cost: request.cost },
        queue.now,
      );
    });
  }

  /** A denied request comes back per its source's retry policy: after Retry-After, a fixed interval, or never. */
  #retry(request: Request, outcome: Outcome): void {
    const retry = this.#sources[request.source]!.retry;
    if (retry.kind === 'none' || request.attempt >= retry.maxRetries) return;
    let waitUs: number;
    if (retry.kind === 'ignore') waitUs = Math.round(retry.intervalMs * 1000);
    else if (outcome.retryAfterMs >= 0) waitUs = Math.max(1, outcome.retryAfterMs * 1000);
    else return;
    const at = this.#queue.now + waitUs;
    if (at >= this.#endUs) return;
    this.#queue.at(at, () =>
      this.#offer(
        new Request(
          this.#nextId++,
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
  }

  /** A fault happens: the network or a store changes (the strategy hears of it after, in `onFault`). */
  #applyFault(fault: Fault): void {
    this.#recorder.count(`fault:${fault.kind}`);
    switch (fault.kind) {
      case 'coordinator-down':
      case 'coordinator-up':
        this.#network.setDown(this.#coordinator, fault.kind === 'coordinator-down');
        return;
      case 'partition':
      case 'heal': {
        const locations = this.#locations;
        for (let a = 0; a < locations.length; a++)
          for (let b = a + 1; b < locations.length; b++)
            if ((locations[a] === fault.region) !== (locations[b] === fault.region))
              this.#network.setCut(a, b, fault.kind === 'partition');
        return;
      }
      case 'redis-failover': {
        const store = this.#stores[fault.region]!;
        const snapshot = this.#failover.get(fault.region);
        if (fault.reset === 'snapshot' && snapshot !== undefined) store.restore(snapshot);
        else store.clear();
        return;
      }
    }
  }

  /** The sample at the start of bin `bin`, then the next one a bin later while bins remain. */
  #sample(bin: number): void {
    const settings = this.#settings;
    const queue = this.#queue;
    const binUs = settings.binS * 1e6;
    this.#recorder.sampleShares(this.#strategy.shares(), queue.now);
    this.#spec.onProgress?.(Math.min(1, (bin * binUs) / this.#endUs));
    if ((bin * settings.binS) % SWEEP_EVERY_S === 0) {
      for (const store of this.#stores) store.sweep(queue.now);
      this.#oracle.sweep(queue.now);
    }
    if (bin + 1 < this.#recorder.series.admitted.length)
      queue.at((bin + 1) * binUs, () => this.#sample(bin + 1));
  }
}
