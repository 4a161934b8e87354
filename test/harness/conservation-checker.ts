/**
 * The budget-conservation invariant, checked at every instant a share changes: for every policy, and for every
 * subject with an override, the shares in force summed over regions never exceed 1. A region's share is the
 * largest any of its agents may be deciding with (agents of one region share one Redis bucket).
 */
import type { AgentLease, InForceChange } from '../../core/lease/agent-lease.js';

const TOLERANCE = 1e-9;

interface Violation {
  at: number;
  policy: string;
  subject: string | undefined;
  sum: number;
  byRegion: Record<string, number>;
}

export class ConservationChecker {
  /** agent → region */
  readonly #regions = new Map<string, string>();
  /** agent → unit key → share */
  readonly #shares = new Map<string, Map<string, number>>();
  readonly violations: Violation[] = [];
  /** Largest sum seen per policy (default vector), for reporting. */
  readonly maxSum = new Map<string, number>();
  events = 0;

  /** Follow one agent's shares in force. */
  watch(agentId: string, region: string, lease: AgentLease): void {
    this.#regions.set(agentId, region);
    this.#shares.set(agentId, new Map());
    lease.onInForce((change) => this.#apply(agentId, change));
  }

  /** The agent stopped: it decides nothing any more. */
  unwatch(agentId: string): void {
    const units = this.#shares.get(agentId);
    this.#shares.delete(agentId);
    this.#regions.delete(agentId);
    for (const key of units?.keys() ?? []) this.#check(key.split('\u0000')[0]!, 0);
  }

  /** Throw with every violation seen, if any. */
  assertHeld(): void {
    if (this.violations.length > 0) {
      const first = this.violations.slice(0, 5).map((v) => JSON.stringify(v));
      throw new Error(`budget conservation violated ${this.violations.length} time(s):\n${first.join('\n')}`);
    }
  }

  #apply(agentId: string, change: InForceChange): void {
    const units = this.#shares.get(agentId);
    if (units === undefined) return;
    this.events++;
    const key = change.subject === undefined ? change.policy : `${change.policy}\u0000${change.subject}`;
    if (change.removed) units.delete(key);
    else units.set(key, change.share);
    this.#check(change.policy, change.at);
  }

  #share(units: Map<string, number>, policy: string, subject: string | undefined): number {
    if (subject !== undefined) {
      const own = units.get(`${policy}\u0000${subject}`);
      if (own !== undefined) return own;
    }
    return units.get(policy) ?? 0;
  }

  #check(policy: string, at: number): void {
    const subjects = new Set<string | undefined>([undefined]);
    for (const units of this.#shares.values()) {
      for (const key of units.keys()) {
        const [p, s] = key.split('\u0000');
        if (p === policy && s !== undefined) subjects.add(s);
      }
    }
    for (const subject of subjects) {
      const byRegion: Record<string, number> = {};
      for (const [agent, units] of this.#shares) {
        const region = this.#regions.get(agent)!;
        byRegion[region] = Math.max(byRegion[region] ?? 0, this.#share(units, policy, subject));
      }
      const sum = Object.values(byRegion).reduce((a, b) => a + b, 0);
      if (subject === undefined) this.maxSum.set(policy, Math.max(this.maxSum.get(policy) ?? 0, sum));
      if (sum > 1 + TOLERANCE) this.violations.push({ at, policy, subject, sum, byRegion });
    }
  }
}
