import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks';
import type { AgentMetrics } from '../observability/metrics.js';

export interface AdmissionOptions {
  /** Most decision requests admitted and not yet answered; beyond it new ones are shed. */
  maxInFlight: number;
  /** Shed while the event loop's delay over the last interval exceeds this (ms); 0 turns the check off. */
  maxEventLoopDelayMs: number;
  /** Retry hint of a shed request, ms (Retry-After is this in whole seconds, rounded up). */
  retryAfterMs: number;
}

/** Why a request was shed. */
export type ShedCause = 'in_flight' | 'event_loop_delay';

/** Where a decision request came in. */
export type AdmissionRoute =
  | 'http'
  | 'forward_auth'
  | 'grpc'
  | 'reservations'
  | 'leases'
  | 'explain'
  | 'strict'
  | 'loan'
  | 'grants'
  | 'terms';

/** How often the event-loop delay is read (and its histogram reset). */
const SAMPLE_MS = 100;

/**
 * Admission control in front of the decision path: a fixed, configurable bound on decisions in flight, and an
 * optional bound on event-loop delay. A request either enters (and later leaves, once answered) or is shed at
 * once, before any parsing or store call. Shedding is cheap and counted; it is never a denial or a store
 * failure. Every admitted request is decided, however long it then waits.
 */
export class Admission {
  readonly #options: AdmissionOptions;
  readonly #metrics: AgentMetrics;
  readonly #histogram: IntervalHistogram | undefined;
  readonly #timer: NodeJS.Timeout | undefined;
  #inFlight = 0;
  #delayMs = 0;
  #shedSinceTaken = 0;

  constructor(options: AdmissionOptions, metrics: AgentMetrics) {
    this.#options = options;
    this.#metrics = metrics;
    if (options.maxEventLoopDelayMs > 0) {
      this.#histogram = monitorEventLoopDelay({ resolution: 10 });
      this.#histogram.enable();
      this.#timer = setInterval(() => this.#sample(), SAMPLE_MS);
      this.#timer.unref();
    }
  }

  /** Decisions admitted and not yet answered. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** The retry hint of a shed request, ms. */
  get retryAfterMs(): number {
    return this.#options.retryAfterMs;
  }

  /**
   * Admit one request: a function to call once it is answered (calling it again does nothing), or the reason it
   * is shed.
   */
  enter(route: AdmissionRoute): (() => void) | ShedCause {
    const cause = this.#refusal();
    if (cause !== undefined) {
      this.#metrics.shed.labels(this.#metrics.region, route, 'overloaded', cause).inc();
      this.#shedSinceTaken++;
      return cause;
    }
    this.#inFlight++;
    this.#metrics.inFlight.set(this.#inFlight);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      this.#inFlight--;
      this.#metrics.inFlight.set(this.#inFlight);
    };
  }

  /** Requests shed since the previous call (the lease holder reports them in each heartbeat). */
  takeShed(): number {
    const shed = this.#shedSinceTaken;
    this.#shedSinceTaken = 0;
    return shed;
  }

  /** Stop sampling the event loop. */
  close(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#histogram?.disable();
  }

  #refusal(): ShedCause | undefined {
    if (this.#inFlight >= this.#options.maxInFlight) return 'in_flight';
    const limit = this.#options.maxEventLoopDelayMs;
    if (limit > 0 && this.#delayMs > limit) return 'event_loop_delay';
    return undefined;
  }

  #sample(): void {
    const histogram = this.#histogram;
    if (histogram === undefined) return;
    // The histogram measures in ns; the largest delay of the interval is what a request arriving now risks.
    this.#delayMs = histogram.count > 0 ? histogram.max / 1e6 : 0;
    histogram.reset();
    this.#metrics.eventLoopDelay.set(Math.round(this.#delayMs) / 1000);
  }
}

/** Retry-After in whole seconds (rounded up, at least 1) for a retry hint in ms. */
export function retryAfterWholeSeconds(ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000));
}

/** Retry-After header value (whole seconds, rounded up, at least 1) for a retry hint in ms. */
export function retryAfterSeconds(ms: number): string {
  return String(retryAfterWholeSeconds(ms));
}
