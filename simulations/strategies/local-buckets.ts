/**
 * The shared shape of strategies that decide every request in its own region from a fixed share: `independent`
 * (share 1 everywhere) and `static` (a fixed split). No control loop, no messages.
 */
import { isLogKind, type Policy } from '../../core/policy/policy.js';
import { BucketSizing } from '../engine/bucket-sizing.js';
import { decideLog } from '../engine/log-decision.js';
import type { RegionStore } from '../engine/region-store.js';
import type { Outcome, SimRequest, Strategy, StrategyContext } from '../strategy.js';

/** A strategy deciding locally with `shareOf(region)`. */
export class FixedShareStrategy implements Strategy {
  readonly #shareOf: (ctx: StrategyContext, region: number) => number;
  #sizing: BucketSizing[] = [];
  #stores: readonly RegionStore[] = [];
  #shares: number[] = [];
  #policy: Policy | undefined;

  constructor(shareOf: (ctx: StrategyContext, region: number) => number) {
    this.#shareOf = shareOf;
  }

  start(ctx: StrategyContext): void {
    this.#shares = ctx.regions.map((_, r) => this.#shareOf(ctx, r));
    this.#sizing = this.#shares.map((share) => new BucketSizing(ctx.policy, share));
    for (const [r, share] of this.#shares.entries()) {
      if (ctx.policy.capacity * share < ctx.policy.maxCost)
        throw new RangeError(
          `region ${ctx.regions[r]!} would hold ${ctx.policy.capacity * share} tokens, less than maxCost ${ctx.policy.maxCost}: its largest requests could never be admitted`,
        );
    }
    this.#stores = ctx.stores;
    this.#policy = ctx.policy;
    ctx.sharesInForce('policy', this.#shares);
  }

  decide(request: SimRequest): Outcome {
    const policy = this.#policy!;
    if (isLogKind(policy.kind)) {
      const store = this.#stores[request.region]!;
      const share = this.#shares[request.region]!;
      return decideLog(policy, store, request.subject, request.cost, share, request.at).outcome;
    }
    const result = this.#stores[request.region]!.decide(
      request.subject,
      this.#sizing[request.region]!.check(request.cost, request.subject),
      request.at,
    );
    return { allowed: result.allowed, retryAfterMs: result.retryAfterMs, decidedAt: request.at };
  }

  shares(): readonly number[] {
    return this.#shares;
  }
}
