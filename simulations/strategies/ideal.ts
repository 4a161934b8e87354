import { isLogKind } from '../../core/policy/policy.js';
import { BucketSizing } from '../engine/bucket-sizing.js';
import { decideLog } from '../engine/log-decision.js';
import { RegionStore } from '../engine/region-store.js';
import type { Outcome, SimRequest, Strategy, StrategyContext, StrategyDefinition } from '../strategy.js';

/**
 * The oracle: one global bucket with the full budget (for the log kinds one global log, or slot counter),
 * decided at the request's arrival with zero latency, immune to every fault. It is also the shadow every run
 * compares against (utilisation, false denials).
 */
class IdealStrategy implements Strategy {
  readonly #store = new RegionStore('global');
  #sizing: BucketSizing | undefined;
  #ctx: StrategyContext | undefined;

  start(ctx: StrategyContext): void {
    this.#ctx = ctx;
    this.#sizing = new BucketSizing(ctx.policy, 1);
  }

  decide(request: SimRequest): Outcome {
    const { policy } = this.#ctx!;
    if (isLogKind(policy.kind))
      return decideLog(policy, this.#store, request.subject, request.cost, 1, request.at).outcome;
    const result = this.#store.decide(
      request.subject,
      this.#sizing!.check(request.cost, request.subject),
      request.at,
    );
    return { allowed: result.allowed, retryAfterMs: result.retryAfterMs, decidedAt: request.at };
  }

  shares(): undefined {
    return undefined;
  }
}

export const ideal: StrategyDefinition = {
  name: 'ideal',
  description: 'one global bucket, zero latency, no faults: the oracle every run is compared with',
  mode: 'regional',
  uses: [],
  create: () => new IdealStrategy(),
};
