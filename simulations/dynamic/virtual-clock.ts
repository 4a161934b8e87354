/**
 * The control plane's clock in a run: core/ reads epoch milliseconds, the simulator counts virtual µs from 0.
 * Coordinator and agents read the same clock (the simulator models no clock skew; `skewMs` still pads every
 * lease and floor as in production). The simulated Redis keeps virtual µs, so floor instants convert back.
 */
import type { Clock } from '../../core/clock.js';

/** Epoch ms of virtual time 0: a plausible wall-clock instant, so no protocol time is ever near 0. */
export const VIRTUAL_EPOCH_MS = 1_750_000_000_000;

/** A core Clock reading the run's virtual time. */
export class VirtualClock implements Clock {
  readonly #nowUs: () => number;

  constructor(nowUs: () => number) {
    this.#nowUs = nowUs;
  }

  now(): number {
    return VIRTUAL_EPOCH_MS + this.#nowUs() / 1000;
  }

  /** Virtual µs of an instant of this clock (ms), rounded up so a timer never fires before it. */
  toVirtualUs(ms: number): number {
    return Math.max(0, Math.ceil((ms - VIRTUAL_EPOCH_MS) * 1000));
  }

  /** The simulated Redis TIME (virtual µs) of an instant of this clock (ms), for refill floors. */
  toStoreUs(ms: number): number {
    return Math.max(0, Math.round((ms - VIRTUAL_EPOCH_MS) * 1000));
  }
}
