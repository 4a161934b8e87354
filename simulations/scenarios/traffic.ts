/**
 * Building blocks of scenario traffic: Poisson sources with time-varying rates (by thinning), synchronized bursts,
 * and subject pickers (one subject, uniform, weighted such as Zipf, fresh one-shot identities).
 */
import type { Random } from '../engine/random.js';
import type { RetryBehaviour, TrafficSource } from '../scenario.js';

/** Chooses the subject of each arrival. */
export interface SubjectPicker {
  pick(random: Random): number;
}

export const NO_RETRY: RetryBehaviour = { kind: 'none' };

/** Always the same subject. */
export function oneSubject(subject: number): SubjectPicker {
  return { pick: () => subject };
}

/** Uniform over subjects [first, first + count). */
export function uniformSubjects(count: number, first = 0): SubjectPicker {
  return { pick: (random) => first + random.int(count) };
}

/** Subject i (from `first`) with probability weights[i] / Σ weights. */
export function weightedSubjects(weights: readonly number[], first = 0): SubjectPicker {
  const cdf = new Float64Array(weights.length);
  let total = 0;
  for (let i = 0; i < weights.length; i++) cdf[i] = total += weights[i]!;
  if (!(total > 0)) throw new RangeError('weights must sum to > 0');
  return {
    pick(random) {
      const u = random.next() * total;
      let lo = 0;
      let hi = cdf.length - 1;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (cdf[mid]! > u) hi = mid;
        else lo = mid + 1;
      }
      return first + lo;
    },
  };
}

/** Zipf weights 1/k^s for ranks k = 1..count. */
export function zipfWeights(count: number, exponent: number): number[] {
  return Array.from({ length: count }, (_, i) => 1 / Math.pow(i + 1, exponent));
}

/** A new subject every time, from one counter shared by every source that holds this picker. */
export function oneShotSubjects(first: number): SubjectPicker {
  let next = first;
  return { pick: () => next++ };
}

/** Costs uniform in 1..maxCost (1 when maxCost is 1). */
export function uniformCost(maxCost: number): (random: Random) => number {
  return maxCost <= 1 ? () => 1 : (random) => 1 + random.int(maxCost);
}

export interface PoissonOptions {
  region: number;
  /** Arrivals per second at time t (s). */
  rate: (tS: number) => number;
  /** An upper bound of `rate` over the run (thinning draws at this rate and keeps rate/maxRate). */
  maxRate: number;
  /** No arrival at or after this time, s. */
  endS: number;
  subjects: SubjectPicker;
  cost: (random: Random) => number;
  retry?: RetryBehaviour;
}

/** A non-homogeneous Poisson process (Lewis–Shedler thinning), µs-granular. */
export function poisson(o: PoissonOptions): TrafficSource {
  const endUs = o.endS * 1e6;
  const meanGapUs = 1e6 / o.maxRate;
  return {
    region: o.region,
    retry: o.retry ?? NO_RETRY,
    nextArrival(after, random) {
      if (!(o.maxRate > 0)) return Infinity;
      let t = after;
      for (;;) {
        t += Math.max(1, Math.round(random.exponential(meanGapUs)));
        if (t >= endUs) return Infinity;
        const r = o.rate(t / 1e6);
        if (r >= o.maxRate || random.next() * o.maxRate < r) return t;
      }
    },
    subject: (_at, random) => o.subjects.pick(random),
    cost: o.cost,
  };
}

export interface BurstOptions {
  region: number;
  /** A burst starts every `everyS` seconds, the first at `firstS`. */
  everyS: number;
  firstS: number;
  /** Requests per burst, spread evenly over `spreadMs`. */
  count: number;
  spreadMs: number;
  endS: number;
  subjects: SubjectPicker;
  cost: (random: Random) => number;
  retry?: RetryBehaviour;
}

/** Bursts at fixed instants (minute boundaries), evenly spaced inside each burst. */
export function bursts(o: BurstOptions): TrafficSource {
  const endUs = o.endS * 1e6;
  const stepUs = o.count > 1 ? Math.max(1, Math.floor((o.spreadMs * 1000) / o.count)) : 0;
  let burst = 0;
  let within = 0;
  let started = false;
  return {
    region: o.region,
    retry: o.retry ?? NO_RETRY,
    nextArrival(after) {
      if (o.count < 1) return Infinity;
      for (;;) {
        if (started) within++;
        started = true;
        if (within >= o.count) {
          within = 0;
          burst++;
        }
        const t = Math.round((o.firstS + burst * o.everyS) * 1e6) + within * stepUs;
        if (t >= endUs) return Infinity;
        if (t >= after) return t;
      }
    },
    subject: (_at, random) => o.subjects.pick(random),
    cost: o.cost,
  };
}
