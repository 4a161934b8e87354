/** A source of wall-clock time, injected everywhere time matters so tests and the simulator can drive it. */
export interface Clock {
  /** Epoch milliseconds. May be fractional. */
  now(): number;
}

/** The process clock. */
export const systemClock: Clock = { now: () => Date.now() };

/** A clock that only moves when told to: for unit tests and the simulator. */
export class ManualClock implements Clock {
  #now: number;

  constructor(startMs = 0) {
    this.#now = startMs;
  }

  now(): number {
    return this.#now;
  }

  /** Move forward (or backward, to model a clock step) by `ms`. */
  advance(ms: number): void {
    this.#now += ms;
  }

  set(ms: number): void {
    this.#now = ms;
  }
}
