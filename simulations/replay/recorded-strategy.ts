/**
 * A strategy whose every decision is one the real stack made: fed to the simulator's own engine on the same
 * arrivals, it lets the engine's oracle, recorder and metrics (over-admission, utilisation, false denials,
 * convergence, the charts' series) measure the real answers exactly as they measure a simulated strategy.
 * An admission counts at the instant its answer came back, rescaled to scenario time (the bucket decided
 * somewhere between the send and that instant).
 */
import { SimConfigError } from '../errors.js';
import type { Outcome, SimRequest, Strategy, StrategyContext, StrategyDefinition } from '../strategy.js';
import type { Recording } from './recording.js';

/** Scenario µs of a wall instant (ms after the replay's start). */
export function scenarioUs(wallMs: number, compression: number): number {
  return Math.round(wallMs * compression * 1000);
}

class RecordedStrategy implements Strategy {
  readonly #recording: Recording;
  readonly #compression: number;
  #ctx: StrategyContext | undefined;
  #shares: readonly number[] | undefined;

  constructor(recording: Recording, compression: number) {
    this.#recording = recording;
    this.#compression = compression;
  }

  start(ctx: StrategyContext): void {
    this.#ctx = ctx;
    const mode = ctx.policy.mode;
    if (mode !== 'regional') {
      // Not measured but structural: a strict policy's bucket is the home region's, a local one is everywhere.
      this.#shares = ctx.regions.map((_, r) => (mode === 'local' || r === ctx.home ? 1 : 0));
      ctx.sharesInForce('policy', this.#shares);
      return;
    }
    for (const sample of this.#recording.shares) {
      ctx.at(Math.max(0, scenarioUs(sample.atMs, this.#compression)), () => {
        this.#shares = sample.shares;
        ctx.sharesInForce('policy', sample.shares);
      });
    }
  }

  decide(request: SimRequest): Outcome {
    const arrival = this.#recording.arrivals[request.id];
    if (
      arrival === undefined ||
      arrival.at !== request.at ||
      arrival.region !== request.region ||
      arrival.subject !== request.subject ||
      arrival.cost !== request.cost
    )
      throw new SimConfigError(
        `request ${request.id} differs from the arrival replayed (the engine made other arrivals for the same seed)`,
      );
    const answer = this.#recording.answers[request.id]!;
    if (answer.status !== 200) return { allowed: false, retryAfterMs: -1, decidedAt: request.at };
    return {
      allowed: answer.allowed,
      retryAfterMs: answer.retryAfterMs ?? -1,
      decidedAt: Math.max(request.at, scenarioUs(answer.answeredMs, this.#compression)),
    };
  }

  shares(): readonly number[] | undefined {
    return this.#ctx === undefined ? undefined : this.#shares;
  }
}

/** `base` (the strategy replayed) with its decisions taken from `recording`. */
export function recordedStrategy(
  base: StrategyDefinition,
  recording: Recording,
  compression: number,
): StrategyDefinition {
  return {
    name: base.name,
    description: `${base.name} as the real stack decided it`,
    mode: base.mode,
    uses: base.uses,
    create: () => new RecordedStrategy(recording, compression),
  };
}
