/**
 * A coordinator's start, step by step: each JetStream call of opening the state and starting the engine runs as a
 * named step and is timed. Every attempt is logged at debug (`start step`: step, ms, outcome); once the
 * coordinator serves, one info line (`coordinator serving`) gives the whole start and each step's time, and the
 * gauges `qp_coord_start_seconds` and `qp_coord_start_step_seconds{step}` / `qp_coord_start_step_failures{step}`
 * hold the same for the last start. A new leader's start after a takeover is what they are for: it meets a
 * JetStream still electing the leaders of the lost region's streams, and these say which call waited.
 */
import { Gauge, type Registry } from 'prom-client';
import type { Logger } from './ports.js';

/** One step of the last start: time spent in it (every attempt), attempts, failed attempts. */
export interface StepTiming {
  readonly step: string;
  readonly ms: number;
  readonly attempts: number;
  readonly failures: number;
  /** Why the last failed attempt failed. */
  readonly lastError?: string;
}

export interface StartStepsOptions {
  log: Logger;
  registry?: Registry;
  /**
   * Whether a failed step is tried again (after `retryMs`): a leader's start goes on for as long as it holds the
   * lease. Default: never (the failure ends the start, as a start without election always did).
   */
  retry?: () => boolean;
  /** Pause before a step is tried again, ms; default START_RETRY_MS. */
  retryMs?: number;
  /** Monotonic milliseconds; default performance.now. */
  now?: () => number;
}

/** Pause before a failed step is tried again, ms. */
export const START_RETRY_MS = 250;

const TOTAL = 'qp_coord_start_seconds';
const STEP = 'qp_coord_start_step_seconds';
const FAILURES = 'qp_coord_start_step_failures';

function gauge<L extends string>(registry: Registry, name: string, help: string, labels: L[]): Gauge<L> {
  const existing = registry.getSingleMetric(name);
  if (existing !== undefined) return existing as Gauge<L>;
  return new Gauge({ name, help, labelNames: labels, registers: [registry] });
}

export class StartSteps {
  readonly #log: Logger;
  readonly #now: () => number;
  readonly #registry: Registry | undefined;
  readonly #retry: () => boolean;
  readonly #retryMs: number;
  readonly #steps = new Map<string, { ms: number; attempts: number; failures: number; lastError?: string }>();
  #began: number;

  constructor(options: StartStepsOptions) {
    this.#log = options.log;
    this.#now = options.now ?? (() => performance.now());
    this.#registry = options.registry;
    this.#retry = options.retry ?? (() => false);
    this.#retryMs = options.retryMs ?? START_RETRY_MS;
    this.#began = this.#now();
  }

  /** Count the start from now (a standby: from the moment it took the lease). */
  begin(): void {
    this.#began = this.#now();
    this.#steps.clear();
  }

  /** Milliseconds since `begin`. */
  elapsedMs(): number {
    return this.#now() - this.#began;
  }

  /**
   * Run `step`, timed; each attempt's outcome is logged at debug and counted. A failed attempt is tried again
   * after retryMs while `retry()` says so (only this step: the steps before it stand), else the error ends it.
   */
  async run<T>(step: string, call: () => Promise<T>): Promise<T> {
    const timing = this.#steps.get(step) ?? { ms: 0, attempts: 0, failures: 0 };
    this.#steps.set(step, timing);
    for (;;) {
      const at = this.#now();
      timing.attempts++;
      try {
        const value = await call();
        const ms = this.#now() - at;
        timing.ms += ms;
        this.#log.debug(
          { step, ms: Math.round(ms), sinceStartMs: Math.round(at - this.#began) },
          'start step',
        );
        return value;
      } catch (error) {
        const ms = this.#now() - at;
        timing.ms += ms;
        timing.failures++;
        timing.lastError = error instanceof Error ? error.message : String(error);
        this.#log.debug(
          { step, ms: Math.round(ms), sinceStartMs: Math.round(at - this.#began), err: error },
          'start step failed',
        );
        if (!this.#retry()) throw error;
        // Once per step at warn: JetStream electing a stream's leader fails a call for seconds, every 250 ms.
        if (timing.failures === 1) {
          this.#log.warn(
            { step, err: error },
            'start step failed; trying it again while this coordinator leads',
          );
        }
        const pause = this.#now();
        await new Promise((resolve) => setTimeout(resolve, this.#retryMs));
        timing.ms += this.#now() - pause;
      }
    }
  }

  /** Every step so far, in the order each first ran. */
  timings(): StepTiming[] {
    return [...this.#steps].map(([step, t]) => ({
      step,
      ms: Math.round(t.ms),
      attempts: t.attempts,
      failures: t.failures,
      ...(t.lastError === undefined ? {} : { lastError: t.lastError }),
    }));
  }

  /** The start is over: the info line and the gauges. */
  done(extra: object = {}): void {
    const totalMs = Math.round(this.elapsedMs());
    const timings = this.timings();
    this.#log.info(
      {
        ...extra,
        startMs: totalMs,
        steps: Object.fromEntries(timings.map((t) => [t.step, t.ms])),
        failed: Object.fromEntries(timings.filter((t) => t.failures > 0).map((t) => [t.step, t.failures])),
      },
      'coordinator serving',
    );
    const registry = this.#registry;
    if (registry === undefined) return;
    gauge(
      registry,
      TOTAL,
      'Time the last start took, s: from taking the leader lease (or from connecting, without election) until serving.',
      [],
    ).set(totalMs / 1000);
    const step = gauge(registry, STEP, 'Time the last start spent in each step (every attempt), s.', [
      'step',
    ]);
    const failures = gauge(registry, FAILURES, 'Failed attempts of each step in the last start.', ['step']);
    for (const t of timings) {
      step.set({ step: t.step }, t.ms / 1000);
      failures.set({ step: t.step }, t.failures);
    }
  }
}

/** One named step of a start: `call`, timed (and tried again while leading) when a StartSteps runs it. */
export type Step = <T>(step: string, call: () => Promise<T>) => Promise<T>;

/** `steps.run`, or the call alone when nothing times the start. */
export function stepper(steps: StartSteps | undefined): Step {
  return steps === undefined ? (_step, call) => call() : (step, call) => steps.run(step, call);
}
