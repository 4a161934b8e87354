import type { Span, Tracer } from '@opentelemetry/api';
import { SpanStatusCode } from '@opentelemetry/api';
import CircuitBreaker from 'opossum';
import { InvalidBucketRequestError } from '../../core/wire/bucket.js';
import { DeadlinePassedError } from '../../core/wire/script.js';
import { CallerDeadlineError } from '../decisions/decision-store.js';
import { CrossSlotError, rodeAlong } from '../redis/bucket-store.js';
import { ScriptError } from '../redis/scripts.js';
import { WireTimeoutError } from './wire-timeout.js';
import type { AgentMetrics } from '../observability/metrics.js';

/** Why a store call produced no answer. */
export type StoreFailureKind = 'timeout' | 'circuit_open' | 'error';

/** A store call that produced no answer in time; the policy's failure mode applies. */
export class StoreUnavailableError extends Error {
  readonly code = 'AGT_STORE_UNAVAILABLE';
  readonly kind: StoreFailureKind;
  constructor(kind: StoreFailureKind, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'StoreUnavailableError';
    this.kind = kind;
  }
}

export interface StoreGuardOptions {
  /** Percent of failed calls in the rolling window that opens the breaker. */
  errorPercent: number;
  /** Calls in the window before the breaker may open. */
  volumeThreshold: number;
  /** How long the breaker stays open before it lets one trial call through. */
  resetMs: number;
  /** Rolling window of the failure statistics. */
  windowMs: number;
}

export type StoreOperation = 'decide' | 'refund' | 'claim' | 'reservation' | 'grant';

/**
 * Errors that say our request was wrong (refused by validation before any I/O, or by the script's own argument
 * checks, or spanning cluster slots), or that its caller's deadline passed before the store could run it, not
 * that Redis is unwell: they never open the breaker. Each is a coded error of its own class; anything else (a
 * reply of the wrong shape, a TypeError from a bug, a connection error) is a store failure.
 */
export function isCallerError(error: unknown): boolean {
  return (
    error instanceof CallerDeadlineError ||
    error instanceof ScriptError ||
    error instanceof CrossSlotError ||
    error instanceof InvalidBucketRequestError
  );
}

/** The breaker's state, when it last changed, and the store failure that opened it. */
export interface BreakerStatus {
  state: 'closed' | 'open' | 'half_open';
  /** Epoch ms of the last change; null before any. */
  since: number | null;
  /** The last store failure before the breaker opened (kind and message); null while it never opened. */
  cause: { kind: StoreFailureKind; message: string } | null;
}

/**
 * Every store call of the decision path goes through here: a circuit breaker (opossum) so a dead or frozen
 * Redis is not hammered, a span, and the latency histogram. Only the store's own failures count against it:
 * connection errors, and replies that did not arrive within the store timeout measured on the wire (the stores
 * time their calls from the write, regional-agent/resilience/wire-timeout.ts). Time a call spends queued in
 * this process never counts, and neither does a caller's error (a request the script refuses).
 */
export class StoreGuard {
  readonly #breaker: CircuitBreaker<[() => Promise<unknown>], unknown>;
  readonly #metrics: AgentMetrics;
  readonly #tracer: Tracer;
  #lastFailure: { kind: StoreFailureKind; message: string } | null = null;
  /** Half-open: the decision let through as the trial, until it is told (its own token). */
  #trial: object | undefined;
  readonly #volumeThreshold: number;
  #status: BreakerStatus = { state: 'closed', since: null, cause: null };

  constructor(
    options: StoreGuardOptions,
    metrics: AgentMetrics,
    tracer: Tracer,
    onState?: (status: BreakerStatus) => void,
  ) {
    this.#metrics = metrics;
    this.#tracer = tracer;
    this.#volumeThreshold = options.volumeThreshold;
    this.#breaker = new CircuitBreaker((fn: () => Promise<unknown>) => fn(), {
      // Calls time themselves on the wire; opossum's timeout would count time queued in this process.
      timeout: false,
      errorThresholdPercentage: options.errorPercent,
      volumeThreshold: options.volumeThreshold,
      resetTimeout: options.resetMs,
      rollingCountTimeout: options.windowMs,
      rollingCountBuckets: 10,
      errorFilter: isCallerError,
      // Only the failure counts decide anything here. Rolling percentiles keep every call's latency in the
      // window and sort them all on each snapshot and each failure, and the snapshots nobody reads are built
      // ten times per window: at thousands of calls per second that cost more than the decisions themselves.
      // Latency is the store latency histogram's job.
      rollingPercentilesEnabled: false,
      enableSnapshots: false,
    });
    metrics.breakerState.set(0);
    const state = (name: BreakerStatus['state'], value: number) => () => {
      this.#trial = undefined;
      this.#failedInARow = 0;
      metrics.breakerState.set(value);
      metrics.breakerTransitions.labels(name).inc();
      this.#status = {
        state: name,
        since: Date.now(),
        cause: name === 'closed' ? this.#status.cause : this.#lastFailure,
      };
      onState?.(this.#status);
    };
    this.#breaker.on('open', state('open', 1));
    this.#breaker.on('halfOpen', state('half_open', 0.5));
    this.#breaker.on('close', state('closed', 0));
  }

  /** The breaker's state, since when, and why it last opened. */
  get status(): BreakerStatus {
    return this.#status;
  }

  /** Current breaker state. */
  get state(): 'closed' | 'open' | 'half_open' {
    if (this.#breaker.opened) return 'open';
    if (this.#breaker.halfOpen) return 'half_open';
    return 'closed';
  }

  /**
   * Run `fn`; throws StoreUnavailableError when the store gave no answer, or the caller's error as it is.
   *
   * The breaker counts Redis calls, not decisions: the token-bucket store sends the decisions of one event-loop
   * turn in one script call (`QP_STORE_BATCHING=batch`, the default), and one late reply must not count as
   * dozens of failures (a burst's first late call would otherwise reach the volume threshold on its own and put
   * every decision on its failure mode for `resetMs`). So a success that rode in another's call (`rodeAlong`) is
   * not told, and a failure is told once per error object (a failed call rejects each of its requests with the
   * same one). Good calls outnumber failed ones on a frozen Redis (its calls on the wire each wait out the
   * timeout), so besides the rate in the window the breaker opens after `volumeThreshold` failed calls in a
   * row. While it is open, decisions fail at once (each counted as a rejected call, as opossum counts them);
   * half-open, one decision is let through as the trial and the others fail at once until it is told.
   */
  async run<T>(operation: StoreOperation, fn: () => Promise<T>): Promise<T> {
    const span: Span = this.#tracer.startSpan(`redis ${operation}`, {
      attributes: { 'db.system': 'redis', 'quotaplane.operation': operation },
    });
    const started = performance.now();
    let outcome = 'ok';
    let trial: object | undefined;
    try {
      if (!this.#breaker.closed) {
        if (!this.#breaker.halfOpen || this.#trial !== undefined) {
          // Open: opossum counts the rejection in its window, as it did when every decision fired through it.
          if (this.#breaker.opened) this.#breaker.fire(succeeded).catch(() => undefined);
          throw Object.assign(new Error('Breaker is open'), { code: 'EOPENBREAKER' });
        }
        this.#trial = trial = {};
      }
      const value = await fn();
      if (!rodeAlong(value)) this.#tellSuccess();
      return value;
    } catch (error) {
      // A script that refused its arguments answered: Redis is well. Other caller errors never reached it.
      if (error instanceof ScriptError) this.#tellSuccess();
      else if ((error as { code?: unknown } | null)?.code !== 'EOPENBREAKER' && !isCallerError(error))
        this.#tellFailure(error);
      const failure = classify(error);
      outcome =
        failure instanceof StoreUnavailableError
          ? failure.kind
          : failure instanceof CallerDeadlineError
            ? 'caller_deadline'
            : 'script_error';
      if (failure instanceof StoreUnavailableError && failure.kind !== 'circuit_open') {
        this.#lastFailure = { kind: failure.kind, message: failure.message };
      }
      if (outcome === 'script_error') this.#metrics.scriptErrors.labels(operation).inc();
      span.recordException(failure);
      span.setStatus({ code: SpanStatusCode.ERROR, message: failure.message });
      throw failure;
    } finally {
      // A trial that told nothing (a caller's error before any I/O, or it rode along) hands the trial on.
      if (
        trial !== undefined &&
        this.#trial === trial &&
        this.#breaker.halfOpen &&
        this.#breaker.pendingClose
      )
        this.#trial = undefined;
      this.#latency(operation, outcome).observe((performance.now() - started) / 1000);
      span.setAttribute('quotaplane.outcome', outcome);
      span.end();
    }
  }

  /** Tell the breaker one Redis call answered: its own call replays the outcome into its statistics. */
  #tellSuccess(): void {
    this.#failedInARow = 0;
    this.#breaker.fire(succeeded).catch(() => undefined);
  }

  /** Tell the breaker one Redis call failed, once per error object (a failed call's requests share it). */
  #tellFailure(error: unknown): void {
    if (typeof error === 'object' && error !== null) {
      if (this.#told.has(error)) return;
      this.#told.add(error);
    }
    const failure = error instanceof Error ? error : new Error(String(error));
    this.#breaker.fire(() => Promise.reject(failure)).catch(() => undefined);
    if (++this.#failedInARow >= this.#volumeThreshold && this.#breaker.closed) this.#breaker.open();
  }

  readonly #told = new WeakSet<object>();
  /** Failed calls told since the last good one (reset on every state change). */
  #failedInARow = 0;

  readonly #latencyChildren = new Map<string, { observe(seconds: number): void }>();

  /** Histogram children are cached: a label lookup on every store call would cost more than the call's own work. */
  #latency(operation: string, outcome: string): { observe(seconds: number): void } {
    const key = `${operation}/${outcome}`;
    let child = this.#latencyChildren.get(key);
    if (child === undefined) {
      child = this.#metrics.storeLatency.labels(operation, outcome);
      this.#latencyChildren.set(key, child);
    }
    return child;
  }

  /** Stop the breaker's timers. */
  shutdown(): void {
    this.#breaker.shutdown();
  }
}

/** The breaker's own call when a store call succeeded. */
const succeeded = (): Promise<void> => Promise.resolve();

function classify(error: unknown): Error {
  if (isCallerError(error)) return error as Error;
  if (error instanceof WireTimeoutError || error instanceof DeadlinePassedError)
    return new StoreUnavailableError('timeout', error.message, { cause: error });
  const code = (error as { code?: unknown } | null)?.code;
  if (code === 'EOPENBREAKER' || code === 'ESHUTDOWN') {
    return new StoreUnavailableError('circuit_open', 'the circuit breaker is open', { cause: error });
  }
  return new StoreUnavailableError('error', (error as Error)?.message ?? String(error), { cause: error });
}
