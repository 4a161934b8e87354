/**
 * The contract between the simulator and an enforcement strategy. A strategy is a controller: it owns how each
 * region's buckets are sized (through the region stores the engine hands it) and, optionally, a control loop
 * that exchanges messages over the simulated network (agents reporting to a coordinator, leases coming back).
 *
 * `dynamic` (strategies/dynamic.ts) is this interface around core/: one LeaseCoordinator on node
 * `ctx.coordinator`, AgentLeases per region, heartbeats, usage, acknowledgements and allocation records carried by
 * `ctx.network.send(…, 'control', …)`; `decide` sizes the region's bucket from the agent's ShareView. Strategies
 * with moving shares report every change of the shares in force with `ctx.sharesInForce`, which is what
 * `maxShareSum` checks. See docs/simulations.md, "Writing a strategy".
 */
import type { PolicyMode, Policy } from '../core/policy/policy.js';
import type { Network } from './engine/network.js';
import type { Random } from './engine/random.js';
import type { RegionStore } from './engine/region-store.js';
import type { Fault } from './scenario.js';
import type { SettingName, Settings } from './settings.js';

/** One request, as it reaches the agent of `region`. */
export interface SimRequest {
  /** Unique within a run, in arrival order. */
  readonly id: number;
  /** Arrival at the region's agent, µs of virtual time. */
  readonly at: number;
  /** Index into `ctx.regions`. */
  readonly region: number;
  /** Subject id (the bucket a policy keeps per subject). */
  readonly subject: number;
  /** Tokens, an integer in [1, policy.maxCost]. */
  readonly cost: number;
  /** 0 for a first attempt, n for a client's n-th retry. */
  readonly attempt: number;
  /** Index of the traffic source that produced it (its clients' retry behaviour). */
  readonly source: number;
  /** Kind concurrency: how long the client holds an admitted slot before releasing it, µs (retries keep it). */
  readonly holdUs?: number | undefined;
}

/**
 * Why a decision was not an ordinary one (docs/design.md `reason`): the strict home did not answer, an emergency
 * bucket decided, or a regional agent held no lease for the policy (it then fails closed, as the agent does).
 */
export type DegradedReason = 'home_unreachable' | 'emergency_bucket' | 'no_lease';

/**
 * Why a request was refused after its agent tried to borrow the subject's tokens from other regions:
 * `subject_exhausted` (every other region is dry: the subject used its global budget, as the oracle would refuse
 * it) or `share_exhausted` (budget may be left elsewhere but could not be had in time).
 */
export type RefusalReason = 'subject_exhausted' | 'share_exhausted';

/** A strategy's answer to one request. */
export interface Outcome {
  allowed: boolean;
  /** ms until the cost could fit (0 when allowed, -1 when it never can): what Retry-After would say. */
  retryAfterMs: number;
  /** µs at which the bucket that admitted (or denied) decided: the instant `overAdmission` counts. */
  decidedAt: number;
  /** Set for degraded decisions. */
  reason?: DegradedReason | undefined;
  /** Set for a refusal after borrowing. */
  refusal?: RefusalReason | undefined;
  /** True when the decision was forwarded to another region (strict mode). */
  forwarded?: boolean | undefined;
  /**
   * Kind concurrency, admitted: the store holding the slots and what names them (the lease). The client
   * releases them there `holdUs` after the answer; the lease runs out by itself after `leaseSeconds`.
   */
  slot?: { store: RegionStore; stamp: number; seq: number } | undefined;
}

/** Returned by `decide` when the outcome comes later, through `ctx.complete`. */
export const PENDING: unique symbol = Symbol('pending');

/** What the engine gives a strategy. All times are µs of virtual time. */
export interface StrategyContext {
  /** Region names; a region is addressed by its index, which is also its network node. */
  readonly regions: readonly string[];
  /** Network node of the coordinator (in the home region; `network.nodes[coordinator] === 'coordinator'`). */
  readonly coordinator: number;
  /** Index of the strict home region (policy.homeRegion). */
  readonly home: number;
  /** The simulated policy, parsed by core/policy/policy.ts with this strategy's mode. */
  readonly policy: Policy;
  readonly settings: Settings;
  /** Regions, coordinator and their links. Faults cut links and take the coordinator down. */
  readonly network: Network;
  /** Each region's Redis. Faults (redis-failover) reset them under the strategy's feet. */
  readonly stores: readonly RegionStore[];
  /** The strategy's own random stream. */
  readonly random: Random;
  /** Current virtual time, µs. */
  now(): number;
  /** Run `fn` at virtual time `time` (µs, ≥ now). */
  at(time: number, fn: () => void): void;
  /** Deliver the outcome of a request for which `decide` returned PENDING. Exactly once per request. */
  complete(request: SimRequest, outcome: Outcome): void;
  /** Add to a strategy-specific counter, reported in results.json `counters`. */
  count(counter: string, n?: number): void;
  /**
   * The shares in force now, by region, for one allocation unit (`unit`: the policy's vector, or a subject's
   * override), as the agents enforce them. Call it at every change: `maxShareSum` and `shareSumAboveOneS` are
   * computed from these reports, so a sum above 1 for a millisecond is seen. A unit no longer in force reports
   * an empty array.
   */
  sharesInForce(unit: string, shares: readonly number[]): void;
}

/** One run's controller. Created fresh for every run. */
export interface Strategy {
  /** Called once at virtual time 0, before the first request. */
  start(ctx: StrategyContext): void;
  /** Decide now, or return PENDING and call `ctx.complete` later (never both). */
  decide(request: SimRequest): Outcome | typeof PENDING;
  /**
   * The policy's share per region in force now (for the shares chart and `maxShareSum`), or undefined when the
   * strategy has no regional split (`ideal`).
   */
  shares(): readonly number[] | undefined;
  /** Told after the engine applied a fault to the network or the stores. */
  onFault?(fault: Fault): void;
  /** Called once after the last event, to add final counters. */
  finish?(): void;
}

/** A named strategy the CLI can run. */
export interface StrategyDefinition {
  readonly name: string;
  /** One line for `--help`. */
  readonly description: string;
  /** The policy mode it enforces with (core/policy/policy.ts). */
  readonly mode: PolicyMode;
  /** Settings it reads, beyond the scenario's and the network's. */
  readonly uses: readonly SettingName[];
  /**
   * Check the settings before any run starts (cross-field rules the schema cannot see); throw a SimConfigError
   * with every problem.
   */
  validate?(settings: Settings, regions: readonly string[], policy: Policy): void;
  /**
   * Why it cannot enforce the policy these settings describe (its kind), or undefined: such a run is left out of
   * the scenario with a note, not refused (`--scenario all` runs every strategy that can).
   */
  cannotEnforce?(settings: Settings): string | undefined;
  create(): Strategy;
}
