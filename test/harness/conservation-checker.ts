/**
 * The budget-conservation invariant (core/lease/shares-in-force.ts), checked at every instant a share changes:
 * for every policy, and for every subject with an override, the shares in force summed over regions never
 * exceed 1. A region's share is the largest any of its agents may be deciding with.
 */
import type { AgentLease, InForceChange } from '../../core/lease/agent-lease.js';
import { exceedsBudget, shareSum, SharesInForce } from '../../core/lease/shares-in-force.js';

interface Violation {
  at: number;
  policy: string;
  subject: string | undefined;
  sum: number;
  byRegion: Record<string, number>;
}

export class ConservationChecker {
  readonly #inForce = new SharesInForce();
  /** Region names by index, in the order agents of them were first watched. */
  readonly #regions: string[] = [];
  readonly #watched = new Set<string>();
  readonly violations: Violation[] = [];
  /** Largest sum seen per policy (default vector), for reporting. */
  readonly maxSum = new Map<string, number>();
  events = 0;

  /** Follow one agent's shares in force. */
  watch(agentId: string, region: string, lease: AgentLease): void {
    let index = this.#regions.indexOf(region);
    if (index < 0) index = this.#regions.push(region) - 1;
    this.#inForce.add(agentId, index);
    this.#watched.add(agentId);
    lease.onInForce((change) => this.#apply(agentId, change));
  }

  /** The agent stopped: it decides nothing any more. */
  unwatch(agentId: string): void {
    this.#watched.delete(agentId);
    for (const policy of this.#inForce.remove(agentId)) this.#check(policy, 0);
  }

  /**
   * A term given in `region` under `share` of `policy` (regional-agent/terms/term-issuer.ts): clients may decide
   * with that share for `ms` (its validity and the agent's margin), whatever the agent that gave it holds or
   * acknowledges meanwhile, and whether or not that agent still runs. Counted as one more agent of the region
   * holding the share in force until then.
   */
  holdTerm(region: string, policy: string, share: number, ms: number, at: number): void {
    let index = this.#regions.indexOf(region);
    if (index < 0) index = this.#regions.push(region) - 1;
    const id = `term-${++this.#terms}`;
    this.#inForce.add(id, index);
    this.#watched.add(id);
    this.terms++;
    this.#inForce.set(id, policy, undefined, share);
    this.#check(policy, at);
    setTimeout(() => this.unwatch(id), ms).unref();
  }

  /** Terms counted (holdTerm). */
  terms = 0;
  #terms = 0;

  /** Throw with every violation seen, if any. */
  assertHeld(): void {
    if (this.violations.length > 0) {
      const first = this.violations.slice(0, 5).map((v) => JSON.stringify(v));
      throw new Error(`budget conservation violated ${this.violations.length} time(s):\n${first.join('\n')}`);
    }
  }

  #apply(agentId: string, change: InForceChange): void {
    if (!this.#watched.has(agentId)) return;
    this.events++;
    this.#inForce.set(agentId, change.policy, change.subject, change.share, change.removed === true);
    this.#check(change.policy, change.at);
  }

  #check(policy: string, at: number): void {
    for (const subject of [undefined, ...this.#inForce.overridden(policy)]) {
      const vector = this.#inForce.vector(policy, subject, this.#regions.length);
      const sum = shareSum(vector);
      if (subject === undefined) this.maxSum.set(policy, Math.max(this.maxSum.get(policy) ?? 0, sum));
      if (exceedsBudget(vector)) {
        const byRegion = Object.fromEntries(this.#regions.map((r, i) => [r, vector[i]!]));
        this.violations.push({ at, policy, subject, sum, byRegion });
      }
    }
  }
}
