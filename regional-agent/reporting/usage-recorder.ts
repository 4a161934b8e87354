/**
 * What an agent tells the coordinator each report interval: per policy, the cost requested, admitted and
 * denied, the demand shares follow, and the few subjects that were denied or close to their regional capacity
 * (candidates for per-subject overrides), all counted by core/shares/usage-accounting.ts. Bounded: a capped number of
 * policies per interval, and per policy the counter's bounds, so a flood of subjects cannot grow the report or
 * the agent's memory.
 */
import { PolicyUsageCounter } from '../../core/shares/usage-accounting.js';
import { MAX_POLICIES_PER_USAGE, MAX_USAGE_CHUNKS, type PolicyUsage } from '../../core/wire/protocol.js';

/** Largest usage message body, bytes (well under NATS's default 1 MiB max payload). */
export const MAX_USAGE_BYTES = 256 * 1024;
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
  /**
   * The policy's rate (its refill per second): the global rate of a subject whose decisions came without their
   * own (`record`'s `ratePerSecond`, its class's), so refusals beyond a subject's own limit do not count as
   * demand; undefined (the policy is unknown here) counts every such subject's refusals.
   */
  limitPerSecond?: (policy: string) => number | undefined;
}

const NONE: ReadonlySet<string> = new Set();

export class UsageRecorder {
  readonly #maxPolicies: number;
  readonly #watched: (policy: string) => ReadonlySet<string>;
  readonly #limit: (policy: string) => number | undefined;
  #policies = new Map<string, PolicyUsageCounter>();
  #dropped = 0;
  #since: number;

  constructor(now: number, options: UsageRecorderOptions = {}) {
    this.#since = now;
    this.#maxPolicies = options.maxPolicies ?? MAX_POLICIES_PER_USAGE * MAX_USAGE_CHUNKS;
    this.#watched = options.watched ?? (() => NONE);
    this.#limit = options.limitPerSecond ?? (() => undefined);
  }

  /**
   * Count one decided check. `remainingFraction` is what the bucket kept after the decision, as a fraction of
   * its capacity (0 when denied). `ratePerSecond` is the subject's own refill (its class's when it has one).
   */
  record(
    policy: string,
    subject: string,
    cost: number,
    allowed: boolean,
    remainingFraction: number,
    ratePerSecond?: number,
  ): void {
    this.#counter(policy)?.record(subject, cost, allowed, remainingFraction, ratePerSecond);
  }

  /** Tokens of `policy` borrowed from other regions and credited here (core/borrowing/). */
  imported(policy: string, tokens: number): void {
    this.#counter(policy)?.imported(tokens);
  }

  #counter(policy: string): PolicyUsageCounter | undefined {
    let counts = this.#policies.get(policy);
    if (counts === undefined) {
      if (this.#policies.size >= this.#maxPolicies) {
        this.#dropped++;
        return undefined;
      }
      counts = new PolicyUsageCounter();
      this.#policies.set(policy, counts);
    }
    return counts;
  }

  /** Everything since the last call, then start a new interval. */
  take(now: number): UsageSnapshot {
    const intervalMs = Math.max(1, Math.round(now - this.#since));
    const policies: PolicyUsage[] = [];
    for (const [policy, c] of this.#policies) {
      policies.push(c.take(policy, intervalMs, this.#limit(policy), this.#watched(policy)));
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
}
