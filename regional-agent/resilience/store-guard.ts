import type { Span, Tracer } from '@opentelemetry/api';
import { SpanStatusCode } from '@opentelemetry/api';
import CircuitBreaker from 'opossum';
import { CrossSlotError, ScriptError } from '../redis/bucket-store.js';
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

export type StoreOperation = 'decide' | 'refund' | 'claim';

/** Errors that say our request was wrong, not that Redis is unwell: they never open the breaker. */
function isCallerError(error: unknown): boolean {
  return error instanceof ScriptError || error instanceof CrossSlotError || error instanceof TypeError;
}

type Action = (fn: () => Promise<unknown>, budgetMs: number) => Promise<unknown>;

/**
 * Every store call of the decision path goes through here: a time budget (what is left of the decision's
 * deadline), a circuit breaker (opossum) so a dead or frozen Redis is not hammered, a span, and the latency
 * histogram. A call that is late is abandoned (its reply, if it ever comes, is dropped) and counts as a failure.
 */
export class StoreGuard {
  readonly #breaker: CircuitBreaker<Parameters<Action>, unknown>;
  readonly #metrics: AgentMetrics;
  readonly #tracer: Tracer;

  constructor(
    options: StoreGuardOptions,
    metrics: AgentMetrics,
    tracer: Tracer,
    onState?: (state: string) => void,
  ) {
    this.#metrics = metrics;
    this.#tracer = tracer;
    const action: Action = (fn, budgetMs) => withBudget(fn(), budgetMs);
    this.#breaker = new CircuitBreaker(action, {
      // The budget is per call (what is left of each decision's deadline), so opossum's fixed timeout is off.
      timeout: false,
      errorThresholdPercentage: options.errorPercent,
      volumeThreshold: options.volumeThreshold,
      resetTimeout: options.resetMs,
      rollingCountTimeout: options.windowMs,
      rollingCountBuckets: 10,
      errorFilter: isCallerError,
    });
    metrics.breakerState.set(0);
    const state = (name: string, value: number) => () => {
      metrics.breakerState.set(value);
      metrics.breakerTransitions.labels(name).inc();
      onState?.(name);
    };
    this.#breaker.on('open', state('open', 1));
    this.#breaker.on('halfOpen', state('half_open', 0.5));
    this.#breaker.on('close', state('closed', 0));
  }

  /** Current breaker state. */
  get state(): 'closed' | 'open' | 'half_open' {
    if (this.#breaker.opened) return 'open';
    if (this.#breaker.halfOpen) return 'half_open';
    return 'closed';
  }

  /** Run `fn` within `budgetMs`; throws StoreUnavailableError when the store gave no answer in time. */
  async run<T>(operation: StoreOperation, fn: () => Promise<T>, budgetMs: number): Promise<T> {
    const span: Span = this.#tracer.startSpan(`redis ${operation}`, {
      attributes: { 'db.system': 'redis', 'quotaplane.operation': operation },
    });
    const started = performance.now();
    let outcome = 'ok';
    try {
      if (budgetMs <= 0)
        throw new StoreUnavailableError('timeout', 'the decision deadline passed before the store call');
      return (await this.#breaker.fire(fn, budgetMs)) as T;
    } catch (error) {
      const failure = classify(error);
      outcome = failure instanceof StoreUnavailableError ? failure.kind : 'script_error';
      if (outcome === 'script_error') this.#metrics.scriptErrors.labels(operation).inc();
      span.recordException(failure);
      span.setStatus({ code: SpanStatusCode.ERROR, message: failure.message });
      throw failure;
    } finally {
      this.#latency(operation, outcome).observe((performance.now() - started) / 1000);
      span.setAttribute('quotaplane.outcome', outcome);
      span.end();
    }
  }

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

class BudgetExceeded extends Error {}

function withBudget<T>(promise: Promise<T>, budgetMs: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new BudgetExceeded(`no answer within ${Math.round(budgetMs)} ms`)),
      budgetMs,
    );
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error instanceof Error ? error : new Error(String(error)));
      },
    );
  });
}

function classify(error: unknown): Error {
  if (isCallerError(error)) return error as Error;
  if (error instanceof BudgetExceeded)
    return new StoreUnavailableError('timeout', error.message, { cause: error });
  const code = (error as { code?: unknown } | null)?.code;
  if (code === 'EOPENBREAKER' || code === 'ESHUTDOWN') {
    return new StoreUnavailableError('circuit_open', 'the circuit breaker is open', { cause: error });
  }
  return new StoreUnavailableError('error', (error as Error)?.message ?? String(error), { cause: error });
}
