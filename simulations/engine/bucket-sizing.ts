/**
 * The script-unit checks a region sends for a share of the policy, built by the same wire encoding the agent
 * uses (core/bucket-wire.ts: capacities round down, costs round up), cached per cost.
 */
import { encodeRequest } from '../../core/bucket-wire.js';
import type { Policy } from '../../core/policy.js';
import type { EncodedCheck } from '../../core/token-bucket.js';

/** Checks for one share of one policy. */
export class BucketSizing {
  readonly share: number;
  readonly #policy: Policy;
  readonly #byCost = new Map<number, EncodedCheck>();

  /** `share` may exceed 1 only for strategies that overcommit on purpose (`independent`, `static` overcommit). */
  constructor(policy: Policy, share: number) {
    if (!(share >= 0)) throw new RangeError(`share must be ≥ 0, got ${share}`);
    this.#policy = policy;
    this.share = share;
  }

  /** The check for a request costing `cost` tokens. */
  check(cost: number): EncodedCheck {
    let check = this.#byCost.get(cost);
    if (check === undefined) {
      const { capacity, refillPerSecond, idleTtlSeconds } = this.#policy;
      check = encodeRequest({
        checks: [
          {
            key: 'sim',
            capacity: capacity * this.share,
            refillPerSecond: refillPerSecond * this.share,
            cost,
            ttlMs: idleTtlSeconds * 1000,
          },
        ],
      }).checks[0]!;
      this.#byCost.set(cost, check);
    }
    return check;
  }
}
