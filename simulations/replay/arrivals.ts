/**
 * A scenario's arrivals, exactly as the simulator makes them: one run of the engine itself (runSimulation) with a
 * strategy that admits everything and writes each request down. Same scenario, seed and settings → the same
 * requests with the same ids, times, regions, subjects and costs, because the traffic sources draw from their own
 * random streams whatever the strategy. Scenarios whose clients retry are refused by the plan, so first attempts
 * are all there is.
 */
import { runSimulation, type RunSpec } from '../engine/run.js';
import type { Outcome, SimRequest, Strategy, StrategyDefinition } from '../strategy.js';

/** One request to replay. */
export interface Arrival {
  /** The engine's request id (arrival order). */
  readonly id: number;
  /** Arrival at its agent, µs of scenario time. */
  readonly at: number;
  /** Index into the run's regions. */
  readonly region: number;
  readonly subject: number;
  readonly cost: number;
}

class Capture implements Strategy {
  readonly arrivals: Arrival[] = [];

  start(): void {}

  decide(r: SimRequest): Outcome {
    this.arrivals.push({ id: r.id, at: r.at, region: r.region, subject: r.subject, cost: r.cost });
    return { allowed: true, retryAfterMs: 0, decidedAt: r.at };
  }

  shares(): undefined {
    return undefined;
  }
}

/** Every arrival of `spec`'s scenario, in id order. `spec.strategy` only lends its policy mode. */
export function captureArrivals(spec: RunSpec): Arrival[] {
  const capture = new Capture();
  const definition: StrategyDefinition = {
    name: `capture-${spec.strategy.name}`,
    description: 'writes every arrival down',
    mode: spec.strategy.mode,
    uses: [],
    create: () => capture,
  };
  runSimulation({ ...spec, strategy: definition, onProgress: undefined });
  capture.arrivals.sort((a, b) => a.id - b.id);
  return capture.arrivals;
}
