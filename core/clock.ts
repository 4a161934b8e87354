/**
 * Sources of time, injected everywhere time matters so tests and the simulator can drive them.
 *
 * Two kinds: `now()` is wall time (epoch ms), the only kind that may cross processes (a deadline on the wire, a
 * cut-off compared with Redis TIME); `monotonic()` never steps (NTP may slew it, never turn it back), for
 * durations within one process: leases, grace periods, budgets refilled over time. A wall-clock step must not
 * lengthen a lease.
 */
export interface Clock {
  /** Epoch milliseconds. May be fractional. */
  now(): number;
  /**
   * Milliseconds from an arbitrary origin that never goes backwards or jumps: for durations only. Optional for
   * older clocks; `monotonicOf` falls back to `now()`.
   */
  monotonic?(): number;
}

/** The process clock: Date.now for wall time, performance.now for durations. */
export const systemClock: Clock = { now: () => Date.now(), monotonic: () => performance.now() };

/** The monotonic ms of `clock` (its wall time when it has no monotonic source). */
export function monotonicOf(clock: Clock): number {
  return clock.monotonic?.() ?? clock.now();
}

/**
 * Wall time that never steps: epoch ms read once from `base`, then moved by `base`'s monotonic clock. For a
 * process whose instants are durations of its own (the coordinator's leases, grace periods, cool-downs) yet are
 * shown or persisted as dates: a wall-clock step on the host neither lengthens nor shortens any of them.
 */
export function steadyClock(base: Clock = systemClock): Clock {
  const wall = base.now();
  const origin = monotonicOf(base);
  return {
    now: () => wall + (monotonicOf(base) - origin),
    monotonic: () => monotonicOf(base),
  };
}

/**
 * A clock that only moves when told to: for unit tests and the simulator. Its monotonic time starts at the same
 * value as its wall time and moves with `advance` and `set`; `step` moves the wall clock alone (an NTP step or an
 * operator's date change).
 */
export class ManualClock implements Clock {
  #now: number;
  #monotonic: number;

  constructor(startMs = 0) {
    this.#now = startMs;
    this.#monotonic = startMs;
  }

  now(): number {
    return this.#now;
  }

  monotonic(): number {
    return this.#monotonic;
  }

  /** Let `ms` pass (both clocks; a negative `ms` turns both back, as older tests model a step). */
  advance(ms: number): void {
    this.#now += ms;
    this.#monotonic += ms;
  }

  /** Let time pass until the wall clock reads `ms` (both clocks move by the difference). */
  set(ms: number): void {
    this.advance(ms - this.#now);
  }

  /** Step the wall clock alone by `ms` (forward or backward): durations are unaffected. */
  step(ms: number): void {
    this.#now += ms;
  }
}
