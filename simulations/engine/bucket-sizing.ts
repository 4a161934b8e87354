/**
 * The script-unit checks a region sends for its share of the policy: core/share-sizing.ts sizes the bucket (the
 * rule the agent's decisions use), core/bucket-wire.ts encodes it (capacities round down, costs round up). Both
 * classes only cache the encoded check per cost, since a share changes once a round at most.
 */
import { encodeRequest } from '../../core/bucket-wire.js';
import type { Policy } from '../../core/policy.js';
import { sizedBucket } from '../../core/share-sizing.js';
import type { RegionalShare } from '../../core/shares.js';
import type { EncodedCheck } from '../../core/token-bucket.js';

function encoded(
  policy: Policy,
  cost: number,
  share: RegionalShare | number,
  toStoreMicros?: (ms: number) => number,
): EncodedCheck {
  return encodeRequest({ checks: [sizedBucket(policy, 'sim', cost, share, toStoreMicros)] }).checks[0]!;
}

/** Checks for one fixed share of one policy. */
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
      check = encoded(this.#policy, cost, this.share);
      this.#byCost.set(cost, check);
    }
    return check;
  }
}

/**
 * Checks for the share a ShareView gives an agent now, floor included; `toStoreMicros` turns the floor's instant
 * (ms of the control plane's clock) into the simulated Redis's µs.
 */
export class ShareSizing {
  readonly #policy: Policy;
  readonly #toStoreMicros: (ms: number) => number;
  #share = -1;
  #floorShare = -1;
  #floorSince = -1;
  #byCost = new Map<number, EncodedCheck>();

  constructor(policy: Policy, toStoreMicros: (ms: number) => number) {
    this.#policy = policy;
    this.#toStoreMicros = toStoreMicros;
  }

  /** The check for a request costing `cost` tokens under `share`. */
  check(share: RegionalShare, cost: number): EncodedCheck {
    const floorShare = share.floor?.share ?? -1;
    const floorSince = share.floor?.sinceMs ?? -1;
    if (share.share !== this.#share || floorShare !== this.#floorShare || floorSince !== this.#floorSince) {
      this.#share = share.share;
      this.#floorShare = floorShare;
      this.#floorSince = floorSince;
      this.#byCost = new Map();
    }
    let check = this.#byCost.get(cost);
    if (check === undefined) {
      check = encoded(this.#policy, cost, share, this.#toStoreMicros);
      this.#byCost.set(cost, check);
    }
    return check;
  }
}
