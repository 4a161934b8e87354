/**
 * The budget-conservation invariant, as one rule: for every allocation unit (a policy's default vector, or one
 * subject's override) the shares in force summed over regions never exceed 1, where a region's share is the
 * largest any of its agents may be deciding with (agents of one region share one Redis bucket) and a subject
 * without an override of its own decides with the policy's default share. Fed by in-force changes
 * (AgentLease.onInForce); the simulator's share-sum metrics and the test harness's conservation checker both
 * read it.
 */

/**
 * Sums of shares above 1 by no more than this are rounding, not overshoot: the coordinator's shares are sums and
 * differences of floats, so a record that conserves the budget may add up to 1 + a few ulps. 1e-9 of a budget is
 * far below a token for any budget a policy can hold (capacity ≤ 1e12 would need 1000 tokens of slack to matter;
 * real budgets are far smaller).
 */
export const SHARE_SUM_TOLERANCE = 1e-9;

/** Sum of a vector of shares. */
export function shareSum(shares: readonly number[]): number {
  let sum = 0;
  for (const s of shares) sum += s;
  return sum;
}

/** True when a sum of shares in force would admit more than the budget. */
export function sumExceedsBudget(sum: number): boolean {
  // Written so that NaN (a share that is no number) exceeds: a sum that cannot be read is no sum within budget.
  return !(sum <= 1 + SHARE_SUM_TOLERANCE);
}

/** True when the shares in force would admit more than the budget. */
export function exceedsBudget(shares: readonly number[]): boolean {
  return sumExceedsBudget(shareSum(shares));
}

interface Agent {
  region: number;
  /** policy → subject ('' for the default vector) → share */
  units: Map<string, Map<string, number>>;
}

/** The shares in force at every agent, by region index. */
export class SharesInForce {
  readonly #agents = new Map<string, Agent>();
  #regionCount = 0;

  /** Follow agent `id` of region index `region`. */
  add(id: string, region: number): void {
    this.#agents.set(id, { region, units: new Map() });
    this.#regionCount = Math.max(this.#regionCount, region + 1);
  }

  /** The agent stopped: it decides nothing any more. Returns the policies it held a share of. */
  remove(id: string): string[] {
    const agent = this.#agents.get(id);
    this.#agents.delete(id);
    return agent === undefined ? [] : [...agent.units.keys()];
  }

  /**
   * Agent `id` may now be deciding with `share` of `policy` for `subject`'s override (the default vector when
   * `subject` is undefined); `removed` when that override is gone. False for an agent not followed.
   */
  set(id: string, policy: string, subject: string | undefined, share: number, removed = false): boolean {
    const agent = this.#agents.get(id);
    if (agent === undefined) return false;
    let units = agent.units.get(policy);
    if (units === undefined) agent.units.set(policy, (units = new Map<string, number>()));
    if (removed) units.delete(subject ?? '');
    else units.set(subject ?? '', share);
    return true;
  }

  /** Subjects of `policy` with an override in force at some agent. */
  overridden(policy: string): Set<string> {
    const out = new Set<string>();
    for (const { units } of this.#agents.values()) {
      for (const subject of units.get(policy)?.keys() ?? []) if (subject !== '') out.add(subject);
    }
    return out;
  }

  /**
   * The shares in force of one unit by region index (`regions` long, default: every region seen): the largest
   * of the region's agents, an agent without an override for `subject` counting with its default share.
   */
  vector(policy: string, subject?: string, regions = this.#regionCount): number[] {
    const out = new Array<number>(regions).fill(0);
    for (const { region, units } of this.#agents.values()) {
      const shares = units.get(policy);
      const share = (subject === undefined ? undefined : shares?.get(subject)) ?? shares?.get('') ?? 0;
      if (share > out[region]!) out[region] = share;
    }
    return out;
  }
}
