/**
 * What an agent tells the coordinator about one policy over one report interval, from the decisions it made:
 * cost requested, admitted and denied, and the subjects that were constrained (denied, or left with less than
 * a tenth of their regional bucket), the most constrained first, at most MAX_CONSTRAINED_PER_POLICY of them.
 */
import { MAX_CONSTRAINED_PER_POLICY, type PolicyUsage } from '../../core/wire/protocol.js';

/** An admission leaving less than this fraction of the bucket makes its subject "near capacity". */
export const NEAR_CAPACITY_FRACTION = 0.1;

interface SubjectUsage {
  requested: number;
  denied: number;
  constrained: boolean;
}

/** The subject string an agent reports for a simulated subject id (a normalized subject, never an identity). */
export function subjectName(subject: number): string {
  return `s${subject}`;
}

export class UsageMeter {
  #requested = 0;
  #admitted = 0;
  #denied = 0;
  #subjects = new Map<number, SubjectUsage>();

  /**
   * One decision: `cost` tokens asked by `subject`, admitted or not, with the tokens left in its bucket and the
   * bucket's capacity (both micro-tokens).
   */
  record(subject: number, cost: number, allowed: boolean, remaining: number, capacity: number): void {
    this.#requested += cost;
    if (allowed) this.#admitted += cost;
    else this.#denied += cost;
    let entry = this.#subjects.get(subject);
    if (entry === undefined) {
      entry = { requested: 0, denied: 0, constrained: false };
      this.#subjects.set(subject, entry);
    }
    entry.requested += cost;
    if (!allowed) {
      entry.denied += cost;
      entry.constrained = true;
    } else if (remaining < NEAR_CAPACITY_FRACTION * capacity) entry.constrained = true;
  }

  #watched(name: string): { subject: string; requested: number; denied: number } {
    for (const [subject, u] of this.#subjects) {
      if (subjectName(subject) === name) return { subject: name, requested: u.requested, denied: u.denied };
    }
    return { subject: name, requested: 0, denied: 0 };
  }

  /** The interval's usage of `policy`, and start a new interval. */
  take(policy: string, watch: ReadonlySet<string> = new Set()): PolicyUsage {
    const all = [...this.#subjects].filter(([, u]) => u.constrained);
    const constrained = all
      .sort(([a, u], [b, v]) => v.denied - u.denied || v.requested - u.requested || a - b)
      .slice(0, MAX_CONSTRAINED_PER_POLICY)
      .map(([subject, u]) => ({ subject: subjectName(subject), requested: u.requested, denied: u.denied }));
    const usage: PolicyUsage = {
      policy,
      requested: this.#requested,
      admitted: this.#admitted,
      denied: this.#denied,
      constrained,
      // As the agent's recorder does: say when the list is cut, so absence from it means nothing.
      ...(all.length > MAX_CONSTRAINED_PER_POLICY ? { truncated: true } : {}),
      // …and report every watched subject with its demand here, zero included.
      ...(watch.size > 0 ? { watched: [...watch].map((name) => this.#watched(name)) } : {}),
    };
    this.#requested = 0;
    this.#admitted = 0;
    this.#denied = 0;
    this.#subjects = new Map();
    return usage;
  }
}
