import { SharesInForce } from '../../core/lease/shares-in-force.js';

/**
 * The shares in force, as the agents enforce them (core/lease/shares-in-force.ts): for every allocation unit (the policy's default vector and
 * each subject's override) and every region, the largest share any agent of the region may be deciding with
 * (agents of one region share one Redis, so the largest bounds what the region admits). Fed by the agents'
 * in-force changes (AgentLease.onInForce, or a naive agent's applied share); every change of a unit's vector is
 * passed on, which is what `maxShareSum` is computed from.
 */

/** Unit name of the policy's default vector. */
export const POLICY_UNIT = 'policy';
/** Unit name of a subject's override. */
export const overrideUnit = (subject: string): string => `override:${subject}`;

/** The one policy a run simulates, as the in-force rule names it. */
const POLICY = 'sim';

export class InForceTracker {
  readonly #regionCount: number;
  readonly #report: (unit: string, shares: readonly number[]) => void;
  readonly #inForce = new SharesInForce();
  #agents = 0;
  /** Last vector reported per unit key ('' = default). */
  readonly #reported = new Map<string, number[]>();

  /** `report(unit, shares)` is called with every change of a unit's vector (an empty one when it is gone). */
  constructor(regionCount: number, report: (unit: string, shares: readonly number[]) => void) {
    this.#regionCount = regionCount;
    this.#report = report;
  }

  /** Track an agent of `region`; returns its handle for `set`. */
  add(region: number): number {
    this.#inForce.add(String(this.#agents), region);
    return this.#agents++;
  }

  /**
   * Agent `agent` may now be deciding with `share` for `subject`'s override (or the default vector when
   * `subject` is undefined); `removed` when that override is gone.
   */
  set(agent: number, subject: string | undefined, share: number, removed = false): void {
    this.#inForce.set(String(agent), POLICY, subject, share, removed);
    this.#publish();
  }

  /** The default vector in force, by region. */
  policyShares(): number[] {
    return this.#reported.get('') ?? this.#vector('');
  }

  #vector(key: string): number[] {
    return this.#inForce.vector(POLICY, key === '' ? undefined : key, this.#regionCount);
  }

  #publish(): void {
    const keys = this.#inForce.overridden(POLICY).add('');
    for (const key of keys) {
      const vector = this.#vector(key);
      const before = this.#reported.get(key);
      if (before !== undefined && before.every((v, i) => v === vector[i])) continue;
      this.#reported.set(key, vector);
      this.#report(key === '' ? POLICY_UNIT : overrideUnit(key), vector);
    }
    for (const key of [...this.#reported.keys()]) {
      if (keys.has(key)) continue;
      this.#reported.delete(key);
      this.#report(overrideUnit(key), []);
    }
  }
}
