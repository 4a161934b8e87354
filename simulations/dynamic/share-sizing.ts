/**
 * The bucket check an agent sends for the share a ShareView gives it, exactly as regional-agent builds it
 * (decision-service.ts): capacity and refill scaled by the share, and the share's rate-history floor turned into
 * the script's floor (buckets last written before the floor instant refill at the lowest share in force since).
 * Encoded by core/bucket-wire.ts; the last share's checks are kept, since shares change once a round at most.
 */
import { encodeRequest } from '../../core/bucket-wire.js';
import type { Policy } from '../../core/policy.js';
import type { RegionalShare } from '../../core/shares.js';
import type { EncodedCheck } from '../../core/token-bucket.js';
import type { VirtualClock } from './virtual-clock.js';

export class ShareSizing {
  readonly #policy: Policy;
  readonly #clock: VirtualClock;
  #share = -1;
  #floorShare = -1;
  #floorSince = -1;
  #byCost = new Map<number, EncodedCheck>();

  constructor(policy: Policy, clock: VirtualClock) {
    this.#policy = policy;
    this.#clock = clock;
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
      const { capacity, refillPerSecond, idleTtlSeconds } = this.#policy;
      const floor = share.floor;
      check = encodeRequest({
        checks: [
          {
            key: 'sim',
            capacity: capacity * share.share,
            refillPerSecond: refillPerSecond * share.share,
            cost,
            ttlMs: idleTtlSeconds * 1000,
            ...(floor === undefined
              ? {}
              : {
                  floor: {
                    beforeMicros: this.#clock.toStoreUs(floor.sinceMs),
                    refillPerSecond: refillPerSecond * floor.share,
                    capacity: capacity * floor.share,
                  },
                }),
          },
        ],
      }).checks[0]!;
      this.#byCost.set(cost, check);
    }
    return check;
  }
}
