import { kindOf } from '../../core/kinds/index.js';
import { DynamicControlPlane } from '../dynamic/control-plane.js';
import {
  borrowingSettings,
  leaseSettings,
  rebalanceSettings,
  validateProtocol,
} from '../dynamic/protocol-settings.js';
import type { Fault } from '../scenario.js';
import type {
  Outcome,
  PENDING,
  SimRequest,
  Strategy,
  StrategyContext,
  StrategyDefinition,
} from '../strategy.js';

/**
 * This design: core's conservation protocol (LeaseCoordinator, AgentLease) moving shares toward demand, shrink
 * first and grow only after acknowledgement or expiry, over the simulated network. See dynamic/control-plane.ts.
 */
export class DynamicStrategy implements Strategy {
  #plane: DynamicControlPlane | undefined;

  /** The control plane of the run (tests look inside). */
  get plane(): DynamicControlPlane | undefined {
    return this.#plane;
  }

  start(ctx: StrategyContext): void {
    const s = ctx.settings;
    this.#plane = new DynamicControlPlane(ctx, {
      lease: leaseSettings(s),
      rebalance: rebalanceSettings(s),
      agentsPerRegion: s.agentsPerRegion,
      standbyAfterMs: s.standbyAfterS * 1000,
      // The agent borrows for the kinds that say so (token buckets): a log's entries are not tokens another
      // region can lend.
      borrowing: kindOf(ctx.policy.kind).borrows ? borrowingSettings(s) : undefined,
    });
    this.#plane.start();
  }

  decide(request: SimRequest): Outcome | typeof PENDING {
    return this.#plane!.decide(request);
  }

  shares(): readonly number[] {
    return this.#plane!.shares();
  }

  onFault(fault: Fault): void {
    this.#plane!.onFault(fault);
  }

  finish(): void {
    this.#plane!.finish();
  }
}

export const dynamic: StrategyDefinition = {
  name: 'dynamic',
  description:
    "this design: core's lease protocol moves shares toward demand, shrink first, grow after acks or expiry; " +
    'a short subject borrows its own tokens from other regions',
  mode: 'regional',
  // homeRegion: the coordinator (and NATS) sits in the home region, so it decides every control message's link.
  uses: [
    'homeRegion',
    'agentsPerRegion',
    'roundMs',
    'reportIntervalMs',
    'leaseMs',
    'graceMs',
    'skewMs',
    'minShare',
    'hysteresis',
    'confirmMs',
    'unmetFraction',
    'damping',
    'demandHalfLifeMs',
    'maxOverrides',
    'borrowing',
    'borrowMaxLenders',
    'borrowLowWater',
    'borrowBackoffMs',
    'forwardTimeoutMs',
    'storeTimeoutMs',
    'logShare',
  ],
  validate: validateProtocol,
  create: () => new DynamicStrategy(),
};
