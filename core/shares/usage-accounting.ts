/**
 * The usage-accounting rule: what one agent counts of one policy's decisions over one report interval, and what
 * of it is demand the coordinator moves shares toward. The agent's usage recorder and the simulator's agents
 * both count through `PolicyUsageCounter`, so the rule exists once.
 *
 * Demand is what the subjects could use under their own limits: everything admitted, plus what was refused as
 * long as the subject stayed within its global rate over the interval. A subject refused far beyond its own
 * limit (one tenant hammering a region at 10× its rate) adds at most its global rate to the region's demand,
 * so it cannot pull budget away from quiet tenants elsewhere:
 *
 *   demand = Σ over subjects s of min(requested_s, max(admitted_s, R_s × interval))
 *
 * with R_s the subject's own refill per second: its class's when it has one (docs/subject-classes.md: an
 * enterprise tenant at 10× counts up to 10× R), else the policy's R. The rate comes with each decision (the
 * decision already holds the policy as its subject's class sees it), so a class changed mid-interval counts at
 * the last rate decided under. Subjects are counted exactly up to `MAX_SUBJECTS_PER_INTERVAL` per
 * interval; past that bound a new subject's admissions still count and its refusals do not (counted in
 * `untracked`, and the report says `truncated`), so memory stays bounded whatever the flood.
 */
import { MAX_CONSTRAINED_PER_POLICY, type ConstrainedSubject, type PolicyUsage } from '../wire/protocol.js';

/** A decision that left less than this fraction of the bucket makes its subject "near capacity" (constrained). */
export const NEAR_CAPACITY_FRACTION = 0.1;
/** Subjects counted exactly per policy and interval (their refusals can count as demand). */
export const MAX_SUBJECTS_PER_INTERVAL = 16_384;
/** Subjects the Space-Saving summary of constrained subjects tracks (it reports the top MAX_CONSTRAINED_PER_POLICY). */
const TRACKED_CONSTRAINED = MAX_CONSTRAINED_PER_POLICY * 4;

interface SubjectCounts {
  requested: number;
  admitted: number;
  /** The subject's own refill per second as its last decision saw it; undefined: the policy's. */
  rate: number | undefined;
}

interface ConstrainedCounts {
  requested: number;
  denied: number;
}

/**
 * Demand of one subject over an interval: all it was admitted, and its refusals up to what its own global rate
 * allows over the interval (`allowance`, tokens).
 */
export function subjectDemand(requested: number, admitted: number, allowance: number): number {
  return Math.min(requested, Math.max(admitted, allowance));
}

/** One policy's decisions at one agent, interval by interval. */
export class PolicyUsageCounter {
  #requested = 0;
  #admitted = 0;
  #denied = 0;
  #untracked = 0;
  #subjects = new Map<string, SubjectCounts>();
  #constrained = new Map<string, ConstrainedCounts>();
  /** A subject took the place of another in the constrained summary: more were constrained than it holds. */
  #evicted = false;
  #decisions = 0;
  #imported = 0;

  /**
   * One decided check of `cost` tokens by `subject`; `remainingFraction` is what its bucket kept after the
   * decision, as a fraction of the bucket's capacity (0 when denied). `ratePerSecond` is the subject's own
   * refill (its class's when it has one); undefined leaves it to the policy's rate given to `take`.
   */
  record(
    subject: string,
    cost: number,
    allowed: boolean,
    remainingFraction: number,
    ratePerSecond?: number,
  ): void {
    this.#decisions++;
    this.#requested += cost;
    if (allowed) this.#admitted += cost;
    else this.#denied += cost;
    let counts = this.#subjects.get(subject);
    if (counts === undefined && this.#subjects.size < MAX_SUBJECTS_PER_INTERVAL) {
      counts = { requested: 0, admitted: 0, rate: ratePerSecond };
      this.#subjects.set(subject, counts);
    }
    if (counts === undefined) {
      if (!allowed) this.#untracked += cost;
    } else {
      counts.requested += cost;
      if (allowed) counts.admitted += cost;
      if (ratePerSecond !== undefined) counts.rate = ratePerSecond;
    }
    if (!allowed || remainingFraction < NEAR_CAPACITY_FRACTION) {
      if (this.#track(subject, cost, allowed ? 0 : cost)) this.#evicted = true;
    }
  }

  /** Tokens borrowed from other regions and credited to this policy's buckets here. */
  imported(tokens: number): void {
    if (tokens > 0) this.#imported += tokens;
  }

  /** Decisions counted since the last `take`. */
  get decisions(): number {
    return this.#decisions;
  }

  /**
   * The interval's usage of `policy` and start a new interval. `limitPerSecond` is the policy's refill R (the
   * global rate of each subject whose decisions did not carry its own); a subject with neither counts every
   * refusal as demand. `watched` subjects are reported with
   * their counts here, zero included.
   */
  take(
    policy: string,
    intervalMs: number,
    limitPerSecond: number | undefined,
    watched: ReadonlySet<string> = NONE,
  ): PolicyUsage {
    let demand = this.#admitted;
    for (const s of this.#subjects.values()) {
      const rate = s.rate ?? limitPerSecond;
      demand +=
        rate === undefined
          ? s.requested - s.admitted
          : subjectDemand(s.requested, s.admitted, (rate * intervalMs) / 1000) - s.admitted;
    }
    const constrained: ConstrainedSubject[] = [...this.#constrained]
      .sort(
        ([a, u], [b, v]) => v.denied - u.denied || v.requested - u.requested || (a < b ? -1 : a > b ? 1 : 0),
      )
      .slice(0, MAX_CONSTRAINED_PER_POLICY)
      .map(([subject, c]) => ({
        subject,
        // The exact count when the subject was tracked; the summary's (constrained decisions only) otherwise.
        requested: this.#subjects.get(subject)?.requested ?? c.requested,
        denied: c.denied,
      }));
    const truncated =
      this.#evicted || this.#constrained.size > MAX_CONSTRAINED_PER_POLICY || this.#untracked > 0;
    const usage: PolicyUsage = {
      policy,
      requested: this.#requested,
      admitted: this.#admitted,
      denied: this.#denied,
      demand: tidy(demand),
      ...(this.#imported > 0 ? { imported: tidy(this.#imported) } : {}),
      constrained,
      ...(truncated ? { truncated } : {}),
      // Every watched subject with its demand here, zero included: the coordinator needs it, constrained or not.
      ...(watched.size > 0
        ? {
            watched: [...watched].map((subject) => {
              const s = this.#subjects.get(subject);
              const c = this.#constrained.get(subject);
              return {
                subject,
                requested: s?.requested ?? c?.requested ?? 0,
                denied: s === undefined ? (c?.denied ?? 0) : s.requested - s.admitted,
              };
            }),
          }
        : {}),
    };
    this.#requested = 0;
    this.#admitted = 0;
    this.#denied = 0;
    this.#untracked = 0;
    this.#decisions = 0;
    this.#imported = 0;
    this.#subjects = new Map();
    this.#constrained = new Map();
    this.#evicted = false;
    return usage;
  }

  /**
   * Space-Saving: a new constrained subject, when the summary is full, takes the place of the smallest one and
   * inherits its counts (an overestimate bounded by that minimum), so heavy hitters are never missed. True when
   * it had to evict another.
   */
  #track(subject: string, cost: number, denied: number): boolean {
    const known = this.#constrained.get(subject);
    if (known !== undefined) {
      known.requested += cost;
      known.denied += denied;
      return false;
    }
    if (this.#constrained.size < TRACKED_CONSTRAINED) {
      this.#constrained.set(subject, { requested: cost, denied });
      return false;
    }
    let smallest: string | undefined;
    let least: ConstrainedCounts | undefined;
    for (const [s, c] of this.#constrained) {
      if (
        least === undefined ||
        c.denied < least.denied ||
        (c.denied === least.denied && c.requested < least.requested)
      ) {
        smallest = s;
        least = c;
      }
    }
    this.#constrained.delete(smallest!);
    this.#constrained.set(subject, { requested: least!.requested + cost, denied: least!.denied + denied });
    return true;
  }
}

const NONE: ReadonlySet<string> = new Set();

/** Sums of token costs (whole or micro-token fractions): no float noise on the wire. */
function tidy(x: number): number {
  return Math.max(0, Math.round(x * 1e6) / 1e6);
}
