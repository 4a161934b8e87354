import { isLogKind } from '../../core/policy/policy.js';
import { kindOf } from '../../core/kinds/index.js';
import { BucketSizing } from '../engine/bucket-sizing.js';
import { decideLog } from '../engine/log-decision.js';
import { RegionStore } from '../engine/region-store.js';
import {
  PENDING,
  type Outcome,
  type SimRequest,
  type Strategy,
  type StrategyContext,
  type StrategyDefinition,
} from '../strategy.js';

/** Retry-After a client gets when the home region did not answer in time: one second, as the agent sends it. */
export const HOME_UNREACHABLE_RETRY_MS = 1000;

interface InFlight {
  done: boolean;
  /** The home bucket admitted (and charged) this request. */
  granted: boolean;
}

/**
 * Policy mode `strict`: one bucket with the whole budget in the home region's store. Requests from other regions
 * are forwarded over the simulated network (a round trip with the links' delay, jitter and loss); if no answer
 * comes within forwardTimeoutMs the policy's failure mode decides: `closed` denies (`home_unreachable`),
 * `local` decides from a small in-process emergency bucket per region (`emergency_bucket`). A grant whose reply
 * was lost or late still cost the home bucket a token: counted as `lostGrants`.
 */
class StrictStrategy implements Strategy {
  #ctx: StrategyContext | undefined;
  #home = 0;
  #sizing: BucketSizing | undefined;
  #emergencySizing: BucketSizing | undefined;
  #emergency: RegionStore[] = [];
  #shares: number[] = [];

  start(ctx: StrategyContext): void {
    this.#ctx = ctx;
    this.#home = ctx.home;
    this.#sizing = new BucketSizing(ctx.policy, 1);
    this.#emergencySizing = new BucketSizing(ctx.policy, ctx.settings.emergencyShare);
    this.#emergency = ctx.regions.map((name) => new RegionStore(`emergency-${name}`));
    this.#shares = ctx.regions.map((_, r) => (r === ctx.home ? 1 : 0));
    ctx.sharesInForce('policy', this.#shares);
  }

  /** The home store's decision at `now`: its bucket, or for a sliding log the whole log. */
  #decideHome(request: SimRequest, now: number): { allowed: boolean; retryAfterMs: number } {
    const ctx = this.#ctx!;
    const store = ctx.stores[this.#home]!;
    if (isLogKind(ctx.policy.kind))
      return decideLog(ctx.policy, store, request.subject, request.cost, 1, now).outcome;
    return store.decide(request.subject, this.#sizing!.check(request.cost, request.subject), now);
  }

  decide(request: SimRequest): Outcome | typeof PENDING {
    const ctx = this.#ctx!;
    const home = this.#home;
    if (request.region === home) {
      const result = this.#decideHome(request, request.at);
      return { allowed: result.allowed, retryAfterMs: result.retryAfterMs, decidedAt: request.at };
    }
    const flight: InFlight = { done: false, granted: false };
    ctx.at(request.at + Math.round(ctx.settings.forwardTimeoutMs * 1000), () => {
      if (flight.done) return;
      flight.done = true;
      if (flight.granted) ctx.count('lostGrants');
      ctx.complete(request, this.#fail(request));
    });
    ctx.network.send(request.region, home, 'data', () => {
      const decidedAt = ctx.now();
      const result = this.#decideHome(request, decidedAt);
      if (result.allowed) {
        if (flight.done) ctx.count('lostGrants');
        flight.granted = true;
      }
      if (flight.done) return;
      ctx.network.send(home, request.region, 'data', () => {
        if (flight.done) return;
        flight.done = true;
        ctx.complete(request, {
          allowed: result.allowed,
          retryAfterMs: result.retryAfterMs,
          decidedAt,
          forwarded: true,
        });
      });
    });
    return PENDING;
  }

  #fail(request: SimRequest): Outcome {
    const ctx = this.#ctx!;
    const now = ctx.now();
    if (ctx.policy.onStoreFailure === 'local') {
      const result = this.#emergency[request.region]!.decide(
        request.subject,
        this.#emergencySizing!.check(request.cost, request.subject),
        now,
      );
      return {
        allowed: result.allowed,
        retryAfterMs: result.retryAfterMs,
        decidedAt: now,
        reason: 'emergency_bucket',
        forwarded: true,
      };
    }
    return {
      allowed: false,
      retryAfterMs: HOME_UNREACHABLE_RETRY_MS,
      decidedAt: now,
      reason: 'home_unreachable',
      forwarded: true,
    };
  }

  shares(): readonly number[] {
    return this.#shares;
  }
}

export const strict: StrategyDefinition = {
  name: 'strict',
  description:
    'one bucket with the full budget in the home region; other regions forward (round trip, timeout, failure mode)',
  mode: 'strict',
  uses: ['forwardTimeoutMs', 'onStoreFailure', 'emergencyShare', 'homeRegion'],
  cannotEnforce: (s) =>
    s.kind !== undefined && !kindOf(s.kind).strictMode
      ? 'a concurrency policy is regional or local (a lease is released in the region that took it)'
      : undefined,
  create: () => new StrictStrategy(),
};
