/**
 * Everything a run measures, fed by the engine as requests arrive and complete, turned into a StrategyResult and
 * the series the charts draw.
 */
import type { Outcome, SimRequest } from '../strategy.js';
import { AdmissionLog, overAdmission } from './over-admission.js';
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
  maxShareSum: number | null = null;
  readonly degraded = new Map<string, number>();
  readonly counters = new Map<string, number>();
  readonly log = new AdmissionLog();
  readonly series: RunSeries;
  readonly #latencies = new Samples();
  readonly #forwarded = new Samples();
  readonly #binUs: number;

  constructor(durationS: number, binS: number, focusSubject: number) {
    const bins = Math.ceil(durationS / binS);
    this.#binUs = binS * 1e6;
    this.series = {
      binS,
      admitted: new Float64Array(bins),
      ideal: new Float64Array(bins),
      focusSubject,
      focusAdmitted: new Float64Array(bins),
      focusIdeal: new Float64Array(bins),
      shares: undefined,
    };
  }

  /** A request reached its agent; the ideal oracle's decision on it is `idealAllowed`. */
  offered(request: SimRequest, idealAllowed: boolean): void {
    this.requests++;
    if (request.attempt > 0) this.retries++;
    if (!idealAllowed) return;
    this.idealAdmitted++;
    this.idealAdmittedCost += request.cost;
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
    if (!outcome.allowed) {
      this.denied++;
      if (idealAllowed) this.falseDenials++;
      return;
    }
    this.admitted++;
    if (!idealAllowed) this.falseAdmissions++;
    this.admittedCost += request.cost;
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

  sampleShares(shares: readonly number[] | undefined): void {
    if (shares === undefined) return;
    (this.series.shares ??= []).push([...shares]);
    let sum = 0;
    for (const s of shares) sum += s;
    this.maxShareSum = Math.max(this.maxShareSum ?? 0, round(sum));
  }

  overAdmission(capacity: number, refillPerSecond: number) {
    const o = overAdmission(this.log, capacity, refillPerSecond);
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
