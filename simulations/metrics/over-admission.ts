/**
 * overAdmission (docs/design.md): for every subject, the most it was granted in any window of W seconds, divided by
 * what the global budget allows in W (C + R·W, its class's C and R for a subject of a class), for W of 1, 10 and 60 s; the worst subject and window count.
 * Computed exactly over admission instants (µs) and costs (micro-tokens), not by sampling: the fullest closed
 * window [t, t + W] always starts at an admission, so a two-pointer pass over each subject's sorted admissions
 * visits every candidate.
 */
import { ownValue, setOwn } from '../../core/own-keys.js';

/** Windows of docs/design.md, seconds. */
export const OVER_ADMISSION_WINDOWS_S = [1, 10, 60] as const;

/** Admissions of every subject, appended in any order. */
export class AdmissionLog {
  readonly #bySubject = new Map<number, { times: number[]; costs: number[] }>();
  count = 0;

  /** `timeUs`: the instant the bucket admitted; `costMicro`: micro-tokens granted. */
  add(subject: number, timeUs: number, costMicro: number): void {
    let entry = this.#bySubject.get(subject);
    if (entry === undefined) {
      entry = { times: [], costs: [] };
      this.#bySubject.set(subject, entry);
    }
    entry.times.push(timeUs);
    entry.costs.push(costMicro);
    this.count++;
  }

  /** Each subject's admissions sorted by time (stable for equal instants). */
  *subjects(): Generator<{ subject: number; times: readonly number[]; costs: readonly number[] }> {
    const ids = [...this.#bySubject.keys()].sort((a, b) => a - b);
    for (const subject of ids) {
      const { times, costs } = this.#bySubject.get(subject)!;
      let sorted = true;
      for (let i = 1; i < times.length && sorted; i++) sorted = times[i - 1]! <= times[i]!;
      if (sorted) {
        yield { subject, times, costs };
        continue;
      }
      const order = times.map((_, i) => i).sort((a, b) => times[a]! - times[b]! || a - b);
      yield { subject, times: order.map((i) => times[i]!), costs: order.map((i) => costs[i]!) };
    }
  }
}

/** The worst window found. */
export interface WorstWindow {
  subject: number;
  windowS: number;
  /** Start of the window, µs. */
  startUs: number;
  /** Micro-tokens admitted in it. */
  admittedMicro: number;
}

export interface OverAdmission {
  /** Max over subjects and windows of admitted(W) / (C + R·W); 0 when nothing was admitted. */
  ratio: number;
  /** The same maximum per window length, keyed `1s`, `10s`, `60s`. */
  byWindow: Record<string, number>;
  worst: WorstWindow | undefined;
}

/**
 * Largest sum of `costs` over a window of `windowUs` starting at one of the sorted `times`, and where it starts.
 * Closed, [t, t + windowUs], by default: a token bucket's C + R·W bound holds over closed windows. `halfOpen`,
 * [t, t + windowUs), for the sliding log: an entry admitted at t no longer counts at t + windowUs.
 */
export function fullestWindow(
  times: readonly number[],
  costs: readonly number[],
  windowUs: number,
  edges: 'closed' | 'halfOpen' = 'closed',
): { sum: number; startUs: number } {
  const open = edges === 'halfOpen';
  let best = 0;
  let bestStart = times[0] ?? 0;
  let sum = 0;
  let j = 0;
  for (let i = 0; i < times.length; i++) {
    const end = times[i]! + windowUs;
    while (j < times.length && (open ? times[j]! < end : times[j]! <= end)) sum += costs[j++]!;
    if (sum > best) {
      best = sum;
      bestStart = times[i]!;
    }
    sum -= costs[i]!;
  }
  return { sum: best, startUs: bestStart };
}

/** One subject's own limits: its class's (docs/subject-classes.md), or the policy's. */
export interface SubjectLimits {
  capacity: number;
  refillPerSecond: number;
}

/**
 * Over-admission of a log against a policy's global budget: capacity C (tokens) and refill R (tokens/s), or for
 * each subject its own (`limitsOf`, a subject of a class measured against its class's C + R·W).
 */
export function overAdmission(
  log: AdmissionLog,
  capacity: number,
  refillPerSecond: number,
  windowsS: readonly number[] = OVER_ADMISSION_WINDOWS_S,
  limitsOf?: (subject: number) => SubjectLimits,
): OverAdmission {
  const byWindow: Record<string, number> = Object.fromEntries(windowsS.map((w) => [`${w}s`, 0]));
  let ratio = 0;
  let worst: WorstWindow | undefined;
  for (const { subject, times, costs } of log.subjects()) {
    const own = limitsOf?.(subject) ?? { capacity, refillPerSecond };
    for (const w of windowsS) {
      const windowUs = w * 1e6;
      // C + R·W in micro-tokens: R tokens/s is R micro-tokens/µs.
      const allowed = own.capacity * 1e6 + own.refillPerSecond * windowUs;
      const { sum, startUs } = fullestWindow(times, costs, windowUs);
      const r = sum / allowed;
      if (r > (ownValue(byWindow, `${w}s`) ?? 0)) setOwn(byWindow, `${w}s`, r);
      if (r > ratio) {
        ratio = r;
        worst = { subject, windowS: w, startUs, admittedMicro: sum };
      }
    }
  }
  return { ratio, byWindow, worst };
}
