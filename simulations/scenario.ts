/**
 * The contract of a scenario: who sends what from where and when (traffic sources), which failures strike when,
 * and when demand shifts. Arrivals are drawn from per-source random streams, so every strategy of a run sees the
 * same first attempts; only client retries depend on the strategy's answers.
 */
import type { Random } from './engine/random.js';
import type { SettingName, Settings } from './settings.js';

/** How a source's clients react to a denial. */
export type RetryBehaviour =
  | { kind: 'none' }
  /** Retry after Retry-After (never when it says never), up to `maxRetries` times. */
  | { kind: 'honour'; maxRetries: number }
  /** Retry every `intervalMs` whatever Retry-After says, up to `maxRetries` times. */
  | { kind: 'ignore'; intervalMs: number; maxRetries: number };

/** A stream of first attempts arriving at one region. */
export interface TrafficSource {
  readonly region: number;
  readonly retry: RetryBehaviour;
  /** Time of the next arrival at or after `after` µs (each call yields a new arrival), Infinity when done. */
  nextArrival(after: number, random: Random): number;
  /** The subject of the arrival at `at`. */
  subject(at: number, random: Random): number;
  /** Its cost, tokens (integer ≥ 1). */
  cost(random: Random): number;
}

/** A failure the engine injects. Regions are indices into the run's regions. */
export type Fault =
  | { kind: 'coordinator-down' }
  | { kind: 'coordinator-up' }
  | { kind: 'partition'; region: number }
  | { kind: 'heal'; region: number }
  /** The region's Redis fails over to a replica that lost writes: buckets reset to an older snapshot, or to full. */
  | { kind: 'redis-failover'; region: number; reset: 'snapshot' | 'full'; lostWritesS: number };

export interface TimedFault {
  atS: number;
  fault: Fault;
}

/** A scenario, made concrete for some regions and settings. */
export interface ScenarioPlan {
  sources: TrafficSource[];
  faults: TimedFault[];
  /** When demand shifts, s; convergence is measured after each (from 0 when empty). */
  shiftsS: number[];
  /** The subject the admitted-rate chart follows (the hottest one). */
  focusSubject: number;
}

/** A named scenario the CLI can run. */
export interface Scenario {
  readonly name: string;
  /** One line for `--help` and the docs. */
  readonly description: string;
  /** Settings that differ from DEFAULT_SETTINGS for this scenario. */
  readonly defaults: Partial<Settings>;
  /** Settings its traffic or faults read. */
  readonly uses: readonly SettingName[];
  plan(regions: readonly string[], settings: Settings): ScenarioPlan;
}
