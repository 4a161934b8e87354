import { NaiveControlPlane } from '../dynamic/naive-control-plane.js';
import { rebalanceSettings, validateRebalancer } from '../dynamic/protocol-settings.js';
import type { Fault } from '../scenario.js';
import type { Outcome, SimRequest, Strategy, StrategyContext, StrategyDefinition } from '../strategy.js';

/** The rebalancer without the two-phase protocol. See dynamic/naive-control-plane.ts. */
class NaiveDynamicStrategy implements Strategy {
  #plane: NaiveControlPlane | undefined;

  start(ctx: StrategyContext): void {
    const s = ctx.settings;
    this.#plane = new NaiveControlPlane(ctx, {
      rebalance: rebalanceSettings(s),
      reportIntervalMs: s.reportIntervalMs,
      agentsPerRegion: s.agentsPerRegion,
    });
    this.#plane.start();
  }

  decide(request: SimRequest): Outcome {
    return this.#plane!.decide(request);
  }

  shares(): readonly number[] {
    return this.#plane!.shares();
  }

  onFault(fault: Fault): void {
    this.#plane!.onFault(fault);
  }
}

export const naiveDynamic: StrategyDefinition = {
  name: 'naive-dynamic',
  description:
    'the same rebalancer, no two-phase protocol: each region applies its new share on receipt (no acks, no leases)',
  mode: 'regional',
  // homeRegion: the coordinator (and NATS) sits in the home region, so it decides every control message's link.
  uses: [
    'homeRegion',
    'agentsPerRegion',
    'roundMs',
    'reportIntervalMs',
    'minShare',
    'hysteresis',
    'confirmMs',
    'unmetFraction',
    'damping',
    'demandHalfLifeMs',
  ],
  validate: validateRebalancer,
  create: () => new NaiveDynamicStrategy(),
};
