/**
 * The shares in force, as the agents enforce them: for every allocation unit (the policy's default vector and
 * each subject's override) and every region, the largest share any agent of the region may be deciding with
 * (agents of one region share one Redis, so the largest bounds what the region admits). Fed by the agents'
 * in-force changes (AgentLease.onInForce, or a naive agent's applied share); every change of a unit's vector is
 * passed on, which is what `maxShareSum` is computed from.
 */

/** Unit name of the policy's default vector. */
export const POLICY_UNIT = 'policy';
/** Unit name of a subject's override. */
export const overrideUnit = (subject: string): string => `override:${subject}`;

interface TrackedAgent {
  region: number;
  /** Unit → share; '' is the default vector, anything else a subject with an override. */
  units: Map<string, number>;
}

export class InForceTracker {
  readonly #regionCount: number;
  readonly #report: (unit: string, shares: readonly number[]) => void;
  readonly #agents: TrackedAgent[] = [];
  /** Last vector reported per unit key ('' = default). */
  readonly #reported = new Map<string, number[]>();

  /** `report(unit, shares)` is called with every change of a unit's vector (an empty one when it is gone). */
  constructor(regionCount: number, report: (unit: string, shares: readonly number[]) => void) {
    this.#regionCount = regionCount;
    this.#report = report;
  }

  /** Track an agent of `region`; returns its handle for `set`. */
  add(region: number): number {
    this.#agents.push({ region, units: new Map() });
    return this.#agents.length - 1;
  }

  /**
   * Agent `agent` may now be deciding with `share` for `subject`'s override (or the default vector when
   * `subject` is undefined); `removed` when that override is gone.
   */
  set(agent: number, subject: string | undefined, share: number, removed = false): void {
    const units = this.#agents[agent]!.units;
    const key = subject ?? '';
    if (removed) units.delete(key);
    else units.set(key, share);
    this.#publish();
  }

  /** The default vector in force, by region. */
  policyShares(): number[] {
    return this.#reported.get('') ?? this.#vector('');
  }

  #vector(key: string): number[] {
    const out = new Array<number>(this.#regionCount).fill(0);
    for (const { region, units } of this.#agents) {
      const share = (key === '' ? undefined : units.get(key)) ?? units.get('') ?? 0;
      if (share > out[region]!) out[region] = share;
    }
    return out;
  }

  #publish(): void {
    const keys = new Set<string>(['']);
    for (const { units } of this.#agents) for (const key of units.keys()) keys.add(key);
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
