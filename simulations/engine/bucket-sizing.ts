/**
 * The script-unit checks a region sends for its share of the policy: core/shares/share-sizing.ts sizes the bucket (the
 * rule the agent's decisions use), core/wire/bucket.ts encodes it (capacities round down, costs round up). Both
 * classes only cache the encoded check per subject class and cost, since a share changes once a round at most. A
 * subject of a class is sized by its class's limits (subject-classes.ts), as the agent sizes it.
 */
import { encodeRequest } from '../../core/wire/bucket.js';
import type { Policy } from '../../core/policy/policy.js';
import { sizedBucket } from '../../core/shares/share-sizing.js';
import type { RegionalShare } from '../../core/shares/shares.js';
import type { EncodedCheck } from '../../core/models/token-bucket.js';
import { SubjectPolicies } from './subject-classes.js';

function encoded(
  policy: Policy,
  cost: number,
  share: RegionalShare | number,
  toStoreMicros?: (ms: number) => number,
): EncodedCheck {
  return encodeRequest({ checks: [sizedBucket(policy, 'sim', cost, share, toStoreMicros)] }).checks[0]!;
}

/** Encoded checks by cost: the policy's own, and one map per subject class. */
class CheckCache {
  readonly #policies: SubjectPolicies;
  #byCost = new Map<number, EncodedCheck>();
  #byClass = new Map<string, Map<number, EncodedCheck>>();

  constructor(policy: Policy) {
    this.#policies = new SubjectPolicies(policy);
  }

  get(subject: number, cost: number, make: (policy: Policy) => EncodedCheck): EncodedCheck {
    const name = this.#policies.classOf(subject);
    let byCost = this.#byCost;
    if (name !== undefined) {
      byCost = this.#byClass.get(name) ?? new Map<number, EncodedCheck>();
      this.#byClass.set(name, byCost);
    }
    let check = byCost.get(cost);
    if (check === undefined) {
      check = make(this.#policies.of(subject));
      byCost.set(cost, check);
    }
    return check;
  }

  clear(): void {
    this.#byCost = new Map();
    this.#byClass = new Map();
  }
}

/** Checks for one fixed share of one policy. */
export class BucketSizing {
  readonly share: number;
  readonly #cache: CheckCache;

  /** `share` may exceed 1 only for strategies that overcommit on purpose (`independent`, `static` overcommit). */
  constructor(policy: Policy, share: number) {
    if (!(share >= 0)) throw new RangeError(`share must be ≥ 0, got ${share}`);
    this.#cache = new CheckCache(policy);
    this.share = share;
  }

  /** The check for a request of `subject` costing `cost` tokens. */
  check(cost: number, subject: number): EncodedCheck {
    return this.#cache.get(subject, cost, (policy) => encoded(policy, cost, this.share));
  }
}

/**
 * Checks for the share a ShareView gives an agent now, floor included; `toStoreMicros` turns the floor's instant
 * (ms of the control plane's clock) into the simulated Redis's µs.
 */
export class ShareSizing {
  readonly #cache: CheckCache;
  readonly #toStoreMicros: (ms: number) => number;
  #share = -1;
  #floorShare = -1;
  #floorSince = -1;

  constructor(policy: Policy, toStoreMicros: (ms: number) => number) {
    this.#cache = new CheckCache(policy);
    this.#toStoreMicros = toStoreMicros;
  }

  /** The check for a request of `subject` costing `cost` tokens under `share`. */
  check(share: RegionalShare, cost: number, subject: number): EncodedCheck {
    const floorShare = share.floor?.share ?? -1;
    const floorSince = share.floor?.sinceMs ?? -1;
    if (share.share !== this.#share || floorShare !== this.#floorShare || floorSince !== this.#floorSince) {
      this.#share = share.share;
      this.#floorShare = floorShare;
      this.#floorSince = floorSince;
      this.#cache.clear();
    }
    return this.#cache.get(subject, cost, (policy) => encoded(policy, cost, share, this.#toStoreMicros));
  }
}
