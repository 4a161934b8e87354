/**
 * overAdmission of the log kinds, against what the policy promises all regions together (docs/sliding-log.md,
 * docs/concurrency.md), computed exactly over admission instants (µs), not by sampling:
 *
 * - `sliding_log`: for every subject, the most units admitted in any rolling window of the policy's length,
 *   divided by its capacity. An entry admitted at `t` counts while `now - window < t`, so the windows are
 *   half-open: admissions at `t` and `t + window` never count together.
 * - `concurrency`: for every subject, the most slots held at one instant, in all regions together, divided by its
 *   capacity. A slot is held from its admission until the client released it or its lease ran out, whichever
 *   came first; at an instant where one slot is freed and another taken, the freed one no longer counts.
 *
 * Both must stay ≤ 1 for a strategy that conserves the budget.
 */
import { fullestWindow, type AdmissionLog } from './over-admission.js';

export interface KindOverAdmission {
  /** Max over subjects of the measure / capacity; 0 when nothing was admitted. */
  ratio: number;
  /** Where it was: the subject, the instant (start of the window, or the instant of most slots held), units. */
  worst: { subject: number; atUs: number; units: number } | undefined;
}

/** Sliding log: the fullest rolling window of `windowUs` of any subject, over `capacity` (log costs: micro-units). */
export function slidingLogOverAdmission(
  log: AdmissionLog,
  capacity: number,
  windowUs: number,
): KindOverAdmission {
  let ratio = 0;
  let worst: KindOverAdmission['worst'];
  for (const { subject, times, costs } of log.subjects()) {
    const { sum, startUs } = fullestWindow(times, costs, windowUs, 'halfOpen');
    const r = sum / 1e6 / capacity;
    if (r > ratio) {
      ratio = r;
      worst = { subject, atUs: startUs, units: sum / 1e6 };
    }
  }
  return { ratio, worst };
}

/** Slots held per subject, each over [from, to) µs. */
export class HeldSlots {
  readonly #bySubject = new Map<number, { at: number; delta: number }[]>();

  add(subject: number, fromUs: number, toUs: number, cost: number): void {
    if (!(toUs > fromUs)) return;
    let events = this.#bySubject.get(subject);
    if (events === undefined) this.#bySubject.set(subject, (events = []));
    events.push({ at: fromUs, delta: cost }, { at: toUs, delta: -cost });
  }

  /** The most slots any subject held at one instant, over `capacity`. */
  overAdmission(capacity: number): KindOverAdmission {
    let ratio = 0;
    let worst: KindOverAdmission['worst'];
    const subjects = [...this.#bySubject.keys()].sort((a, b) => a - b);
    for (const subject of subjects) {
      // Releases before acquisitions at the same instant: a slot is free again from its end on.
      const events = this.#bySubject.get(subject)!.sort((a, b) => a.at - b.at || a.delta - b.delta);
      let held = 0;
      for (const { at, delta } of events) {
        held += delta;
        if (held / capacity > ratio) {
          ratio = held / capacity;
          worst = { subject, atUs: at, units: held };
        }
      }
    }
    return { ratio, worst };
  }
}
