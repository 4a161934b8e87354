/**
 * Everything a run measures, fed by the engine as requests arrive and complete, turned into a StrategyResult and
 * the series the charts draw.
 */
import { exceedsBudget, shareSum, sumExceedsBudget } from '../../core/lease/shares-in-force.js';
import { kindOf, type KindName } from '../../core/kinds/index.js';
import type { Outcome, SimRequest } from '../strategy.js';
import { HeldSlots, slidingLogOverAdmission } from './kind-over-admission.js';
import { AdmissionLog, overAdmission, type SubjectLimits } from './over-admission.js';
import { percentile, Samples } from './percentiles.js';

/** Per-bin series of one run, for the charts and convergence. Tokens per bin. */
export interface RunSeries {
  binS: number;
  admitted: Float64Array;
  ideal: Float64Array;
  focusSubject: number;
  focusAdmitted: Float64Array;
  focusIdeal: Float64Array;
  /** Shares per region sampled at the start of each bin; undefined without a regional split. */
  shares: number[][] | undefined;
  /**
   * Per bin, the largest sum of shares in force reported during it (any allocation unit), so a sum above 1 for a
   * few milliseconds shows on the chart; undefined when the strategy reports none.
   */
  shareSumMax: Float64Array | undefined;
}

const round = (x: number) => Math.round(x * 1e6) / 1e6;
const ms = (us: number) => round(us / 1000);

export class Recorder {
  requests = 0;
  retries = 0;
  admitted = 0;
  admittedCost = 0;
  denied = 0;
  idealAdmitted = 0;
  idealAdmittedCost = 0;
  falseDenials = 0;
  falseAdmissions = 0;
  /** The same counts for requests that arrived after the warm-up (what utilisation and false rates use). */
  readonly measured = {
    requests: 0,
    admittedCost: 0,
    idealAdmittedCost: 0,
    falseDenials: 0,
    falseAdmissions: 0,
  };
  maxShareSum: number | null = null;
  /** µs during which some unit's shares in force summed above 1. */
  shareSumAboveOneUs = 0;
  readonly degraded = new Map<string, number>();
  readonly counters = new Map<string, number>();
  readonly log = new AdmissionLog();
  /** Kind concurrency: the slots each admission held, and for how long (the engine adds them). */
  readonly held = new HeldSlots();
  readonly series: RunSeries;
  readonly #latencies = new Samples();
  readonly #forwarded = new Samples();
  readonly #binUs: number;
  /** Current sum of the shares in force per allocation unit (reported by the strategy). */
  readonly #unitSums = new Map<string, number>();
  #unitsAboveOne = 0;
  #aboveOneSince = 0;
  readonly #endUs: number;
  readonly #warmupUs: number;

  constructor(durationS: number, binS: number, focusSubject: number, warmupS = 0) {
    this.#warmupUs = warmupS * 1e6;
    const bins = Math.ceil(durationS / binS);
    this.#endUs = durationS * 1e6;
    this.#binUs = binS * 1e6;
    this.series = {
      binS,
      admitted: new Float64Array(bins),
      ideal: new Float64Array(bins),
      focusSubject,
      focusAdmitted: new Float64Array(bins),
      focusIdeal: new Float64Array(bins),
      shares: undefined,
      shareSumMax: undefined,
    };
  }

  /** Per subject, cost admitted and cost the oracle admitted, after the warm-up: the worst subject. */
  readonly #bySubject = new Map<number, { admitted: number; ideal: number }>();

  #subject(subject: number): { admitted: number; ideal: number } {
    let entry = this.#bySubject.get(subject);
    if (entry === undefined) this.#bySubject.set(subject, (entry = { admitted: 0, ideal: 0 }));
    return entry;
  }

  /**
   * The subject that got the smallest fraction of what the ideal oracle admitted it after the warm-up, among
   * subjects the oracle admitted at least `minCost` tokens (fewer says nothing about a budget); null when none.
   */
  worstSubject(
    minCost: number,
  ): { subject: number; admittedFraction: number; idealAdmittedCost: number } | null {
    let worst: { subject: number; admittedFraction: number; idealAdmittedCost: number } | null = null;
    for (const [subject, { admitted, ideal }] of this.#bySubject) {
      if (ideal < minCost) continue;
      const fraction = admitted / ideal;
      if (
        worst === null ||
        fraction < worst.admittedFraction ||
        (fraction === worst.admittedFraction && subject < worst.subject)
      )
        worst = { subject, admittedFraction: fraction, idealAdmittedCost: ideal };
    }
    return worst === null
      ? null
      : {
          ...worst,
          admittedFraction: round(worst.admittedFraction),
          idealAdmittedCost: round(worst.idealAdmittedCost),
        };
  }

  /** A request reached its agent; the ideal oracle's decision on it is `idealAllowed`. */
  offered(request: SimRequest, idealAllowed: boolean): void {
    this.requests++;
    const measured = request.at >= this.#warmupUs;
    if (measured) this.measured.requests++;
    if (request.attempt > 0) this.retries++;
    if (!idealAllowed) return;
    this.idealAdmitted++;
    this.idealAdmittedCost += request.cost;
    if (measured) {
      this.measured.idealAdmittedCost += request.cost;
      this.#subject(request.subject).ideal += request.cost;
    }
    const bin = Math.floor(request.at / this.#binUs);
    if (bin < this.series.ideal.length) {
      this.series.ideal[bin]! += request.cost;
      if (request.subject === this.series.focusSubject) this.series.focusIdeal[bin]! += request.cost;
    }
  }

  completed(request: SimRequest, outcome: Outcome, idealAllowed: boolean, nowUs: number): void {
    const latency = nowUs - request.at;
    this.#latencies.push(latency);
    if (outcome.forwarded === true) this.#forwarded.push(latency);
    if (outcome.reason !== undefined) this.#bump(this.degraded, outcome.reason);
    const measured = request.at >= this.#warmupUs;
    if (!outcome.allowed) {
      this.denied++;
      if (idealAllowed) this.falseDenials++;
      if (idealAllowed && measured) this.measured.falseDenials++;
      return;
    }
    this.admitted++;
    if (!idealAllowed) this.falseAdmissions++;
    if (!idealAllowed && measured) this.measured.falseAdmissions++;
    this.admittedCost += request.cost;
    if (measured) {
      this.measured.admittedCost += request.cost;
      this.#subject(request.subject).admitted += request.cost;
    }
    this.log.add(request.subject, outcome.decidedAt, request.cost * 1e6);
    const bin = Math.floor(outcome.decidedAt / this.#binUs);
    if (bin < this.series.admitted.length) {
      this.series.admitted[bin]! += request.cost;
      if (request.subject === this.series.focusSubject) this.series.focusAdmitted[bin]! += request.cost;
    }
  }

  count(counter: string, n = 1): void {
    this.#bump(this.counters, counter, n);
  }

  /** Shares per region at the start of a bin (the chart), at `nowUs`. */
  sampleShares(shares: readonly number[] | undefined, nowUs: number): void {
    if (shares === undefined) return;
    (this.series.shares ??= []).push([...shares]);
    let sum = 0;
    for (const s of shares) sum += s;
    this.maxShareSum = Math.max(this.maxShareSum ?? 0, round(sum));
    if (this.#unitSums.size > 0) {
      let current = 0;
      for (const v of this.#unitSums.values()) current = Math.max(current, v);
      this.#binMax(nowUs, current);
    }
  }

  /** The shares in force of one allocation unit changed at `nowUs` (an empty vector: the unit is gone). */
  sharesInForce(unit: string, shares: readonly number[], nowUs: number): void {
    const sum = shareSum(shares);
    const before = this.#unitSums.get(unit) ?? 0;
    if (shares.length === 0) this.#unitSums.delete(unit);
    else this.#unitSums.set(unit, sum);
    this.maxShareSum = Math.max(this.maxShareSum ?? 0, round(sum));
    this.#binMax(nowUs, sum);
    const wasAbove = sumExceedsBudget(before);
    const isAbove = exceedsBudget(shares);
    if (wasAbove === isAbove) return;
    // Time above the budget counts within the run only (not while in-flight work finishes past its end).
    const at = Math.min(nowUs, this.#endUs);
    if (isAbove && this.#unitsAboveOne++ === 0) this.#aboveOneSince = at;
    if (!isAbove && --this.#unitsAboveOne === 0) this.shareSumAboveOneUs += at - this.#aboveOneSince;
  }

  /** Close the share accounting at the end of the run. */
  closeShares(): void {
    if (this.#unitsAboveOne > 0) this.shareSumAboveOneUs += this.#endUs - this.#aboveOneSince;
    this.#unitsAboveOne = 0;
  }

  #binMax(nowUs: number, sum: number): void {
    const bins = this.series.admitted.length;
    const bin = Math.floor(nowUs / this.#binUs);
    if (bin >= bins) return;
    const max = (this.series.shareSumMax ??= new Float64Array(bins));
    max[bin] = Math.max(max[bin]!, sum);
  }

  overAdmission(capacity: number, refillPerSecond: number, limitsOf?: (subject: number) => SubjectLimits) {
    const o = overAdmission(this.log, capacity, refillPerSecond, undefined, limitsOf);
    return {
      overAdmission: round(o.ratio),
      overAdmissionByWindow: Object.fromEntries(Object.entries(o.byWindow).map(([k, v]) => [k, round(v)])),
      worstWindow:
        o.worst === undefined
          ? null
          : {
              subject: o.worst.subject,
              windowS: o.worst.windowS,
              startS: round(o.worst.startUs / 1e6),
              admitted: round(o.worst.admittedMicro / 1e6),
            },
    };
  }

  /**
   * overAdmission of a log kind (metrics/kind-over-admission.ts): the fullest rolling window of `windowUs`
   * (sliding_log) or the most slots held at once (concurrency), over the capacity; `overAdmissionByWindow` names
   * the one measure (`600s`, or `inFlight`) and `worstWindow` where it was (`windowS` 0 for an instant).
   */
  kindOverAdmission(kind: KindName, capacity: number, windowUs: number) {
    const concurrency = kindOf(kind).leases;
    const o = concurrency
      ? this.held.overAdmission(capacity)
      : slidingLogOverAdmission(this.log, capacity, windowUs);
    return {
      overAdmission: round(o.ratio),
      overAdmissionByWindow: { [concurrency ? 'inFlight' : `${windowUs / 1e6}s`]: round(o.ratio) },
      worstWindow:
        o.worst === undefined
          ? null
          : {
              subject: o.worst.subject,
              windowS: concurrency ? 0 : windowUs / 1e6,
              startS: round(o.worst.atUs / 1e6),
              admitted: round(o.worst.units),
            },
    };
  }

  get forwarded(): number {
    return this.#forwarded.length;
  }

  latencyMs() {
    const all = this.#latencies.sorted();
    const fwd = this.#forwarded.sorted();
    const summary = (s: Float64Array) => ({
      p50: ms(percentile(s, 50)),
      p99: ms(percentile(s, 99)),
      max: ms(s.length === 0 ? 0 : s[s.length - 1]!),
    });
    return { latencyMs: summary(all), forwardedLatencyMs: fwd.length === 0 ? null : summary(fwd) };
  }

  #bump(map: Map<string, number>, key: string, n = 1): void {
    map.set(key, (map.get(key) ?? 0) + n);
  }
}

/** A map as a plain object with sorted keys, so results.json is byte-stable. */
export function sortedRecord(map: ReadonlyMap<string, number>): Record<string, number> {
  return Object.fromEntries([...map.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

export { round as roundMetric };
