/**
 * What an agent tells the coordinator each report interval: per policy, the cost requested, admitted and
 * denied, and the few subjects that were denied or close to their regional capacity (candidates for
 * per-subject overrides). Bounded: a capped number of policies per interval and a small Space-Saving summary
 * of constrained subjects per policy, so a flood of subjects cannot grow the report or the agent's memory.
 */
import {
  MAX_CONSTRAINED_PER_POLICY,
  MAX_POLICIES_PER_USAGE,
  MAX_USAGE_CHUNKS,
  type PolicyUsage,
} from '../../core/wire/protocol.js';

/** Largest usage message body, bytes (well under NATS's default 1 MiB max payload). */
export const MAX_USAGE_BYTES = 256 * 1024;
/** A decision left less than this fraction of the bucket: its subject counts as close to capacity. */
export const NEAR_CAPACITY_FRACTION = 0.1;
/** Subjects the Space-Saving summary tracks per policy (it reports the top MAX_CONSTRAINED_PER_POLICY). */
const TRACKED_SUBJECTS = MAX_CONSTRAINED_PER_POLICY * 4;

interface SubjectCounts {
  requested: number;
  denied: number;
}

interface PolicyCounts {
  requested: number;
  admitted: number;
  denied: number;
  subjects: Map<string, SubjectCounts>;
  /** A subject took the place of another in the summary: more were constrained than it holds. */
  evicted: boolean;
  /** Watched subjects' counts (bounded by the record's watch list). */
  watched: Map<string, SubjectCounts>;
}

/** One interval's usage, ready to send in chunks. */
export interface UsageSnapshot {
  intervalMs: number;
  chunks: PolicyUsage[][];
  /** Policies left out because the report reached its bound. */
  dropped: number;
}

export interface UsageRecorderOptions {
  /** Most policies counted per interval. */
  maxPolicies?: number;
  /** The subjects each policy's record asks to report every interval (AgentLease.watched). */
  watched?: (policy: string) => ReadonlySet<string>;
}

const NONE: ReadonlySet<string> = new Set();

export class UsageRecorder {
  readonly #maxPolicies: number;
  readonly #watched: (policy: string) => ReadonlySet<string>;
  #policies = new Map<string, PolicyCounts>();
  #dropped = 0;
  #since: number;

  constructor(now: number, options: UsageRecorderOptions = {}) {
    this.#since = now;
    this.#maxPolicies = options.maxPolicies ?? MAX_POLICIES_PER_USAGE * MAX_USAGE_CHUNKS;
    this.#watched = options.watched ?? (() => NONE);
  }

  /**
   * Count one decided check. `remainingFraction` is what the bucket kept after the decision, as a fraction of
   * its capacity (0 when denied).
   */
  record(policy: string, subject: string, cost: number, allowed: boolean, remainingFraction: number): void {
    let counts = this.#policies.get(policy);
    if (counts === undefined) {
      if (this.#policies.size >= this.#maxPolicies) {
        this.#dropped++;
        return;
      }
      counts = {
        requested: 0,
        admitted: 0,
        denied: 0,
        subjects: new Map(),
        evicted: false,
        watched: new Map(),
      };
      this.#policies.set(policy, counts);
    }
    counts.requested += cost;
    if (allowed) counts.admitted += cost;
    else counts.denied += cost;
    if (this.#watched(policy).has(subject)) {
      const w = counts.watched.get(subject);
      if (w === undefined) counts.watched.set(subject, { requested: cost, denied: allowed ? 0 : cost });
      else {
        w.requested += cost;
        if (!allowed) w.denied += cost;
      }
    }
    if (!allowed || remainingFraction < NEAR_CAPACITY_FRACTION) {
      if (this.#constrained(counts.subjects, subject, cost, allowed ? 0 : cost)) counts.evicted = true;
    }
  }

  /** Everything since the last call, then start a new interval. */
  take(now: number): UsageSnapshot {
    const intervalMs = Math.max(1, Math.round(now - this.#since));
    const policies: PolicyUsage[] = [];
    for (const [policy, c] of this.#policies) {
      const constrained = [...c.subjects]
        .sort((a, b) => b[1].denied - a[1].denied || b[1].requested - a[1].requested)
        .slice(0, MAX_CONSTRAINED_PER_POLICY)
        .map(([subject, s]) => ({ subject, requested: s.requested, denied: s.denied }));
      const truncated = c.evicted || c.subjects.size > MAX_CONSTRAINED_PER_POLICY;
      // Every watched subject, zero included: the coordinator needs its demand here, constrained or not.
      const watchedSubjects = this.#watched(policy);
      const watched = [...watchedSubjects].map((subject) => {
        const w = c.watched.get(subject);
        return { subject, requested: w?.requested ?? 0, denied: w?.denied ?? 0 };
      });
      policies.push({
        policy,
        requested: c.requested,
        admitted: c.admitted,
        denied: c.denied,
        constrained,
        ...(truncated ? { truncated } : {}),
        ...(watched.length > 0 ? { watched } : {}),
      });
    }
    // Chunks bounded by count and by size (NATS refuses messages above its max payload, 1 MiB by default);
    // what does not fit in MAX_USAGE_CHUNKS is dropped and counted.
    const chunks: PolicyUsage[][] = [[]];
    let bytes = 0;
    let dropped = this.#dropped;
    for (const p of policies) {
      const size = JSON.stringify(p).length + 1;
      let chunk = chunks[chunks.length - 1]!;
      if (chunk.length > 0 && (chunk.length >= MAX_POLICIES_PER_USAGE || bytes + size > MAX_USAGE_BYTES)) {
        if (chunks.length >= MAX_USAGE_CHUNKS) {
          dropped++;
          continue;
        }
        chunks.push((chunk = []));
        bytes = 0;
      }
      chunk.push(p);
      bytes += size;
    }
    const snapshot = { intervalMs, chunks, dropped };
    this.#policies = new Map();
    this.#dropped = 0;
    this.#since = now;
    return snapshot;
  }

  /**
   * Space-Saving: a new subject, when the summary is full, takes the place of the smallest one and inherits its
   * counts (an overestimate bounded by that minimum), so heavy hitters are never missed.
   */
  /** Count a constrained subject; true when it had to evict another. */
  #constrained(subjects: Map<string, SubjectCounts>, subject: string, cost: number, denied: number): boolean {
    const known = subjects.get(subject);
    if (known !== undefined) {
      known.requested += cost;
      known.denied += denied;
      return false;
    }
    if (subjects.size < TRACKED_SUBJECTS) {
      subjects.set(subject, { requested: cost, denied });
      return false;
    }
    let smallest: string | undefined;
    let least: SubjectCounts | undefined;
    for (const [s, c] of subjects) {
      if (
        least === undefined ||
        c.denied < least.denied ||
        (c.denied === least.denied && c.requested < least.requested)
      ) {
        smallest = s;
        least = c;
      }
    }
    subjects.delete(smallest!);
    subjects.set(subject, { requested: least!.requested + cost, denied: least!.denied + denied });
    return true;
  }
}
