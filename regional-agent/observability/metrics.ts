import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export interface AgentMetricsOptions {
  region: string;
  /** Also export the process's default metrics (CPU, memory, event loop). Default true. */
  processMetrics?: boolean;
}

/**
 * The agent's Prometheus metrics, in a registry of its own (several agents may live in one test process).
 * Labels carry policy names, regions, outcomes and codes, never a subject.
 */
export class AgentMetrics {
  readonly registry = new Registry();
  readonly region: string;
  readonly decisions: Counter<'policy' | 'region' | 'decision' | 'mode'>;
  readonly degraded: Counter<'policy' | 'region' | 'reason' | 'cause'>;
  readonly retryAfter: Histogram<'policy' | 'region'>;
  readonly storeLatency: Histogram<'operation' | 'outcome'>;
  readonly scriptErrors: Counter<'operation'>;
  readonly refunds: Counter<'outcome'>;
  readonly idempotency: Counter<'outcome'>;
  readonly requestErrors: Counter<'code'>;
  readonly breakerState: Gauge;
  readonly breakerTransitions: Counter<'state'>;
  readonly policies: Gauge;
  readonly policyReloads: Counter<'outcome'>;
  readonly #decisionChildren = new Map<string, { inc(): void }>();

  constructor(options: AgentMetricsOptions) {
    this.region = options.region;
    const registers = [this.registry];
    this.decisions = new Counter({
      name: 'quotaplane_decisions_total',
      help: 'Checks decided, by policy, region, decision (allowed/denied) and policy mode.',
      labelNames: ['policy', 'region', 'decision', 'mode'],
      registers,
    });
    this.degraded = new Counter({
      name: 'quotaplane_degraded_decisions_total',
      help: 'Checks decided by a failure mode or refused for a reason other than an empty bucket.',
      labelNames: ['policy', 'region', 'reason', 'cause'],
      registers,
    });
    this.retryAfter = new Histogram({
      name: 'quotaplane_retry_after_seconds',
      help: 'Retry-after of denied requests, in seconds.',
      labelNames: ['policy', 'region'],
      buckets: [0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600],
      registers,
    });
    this.storeLatency = new Histogram({
      name: 'quotaplane_store_latency_seconds',
      help: 'Latency of bucket store calls, by operation and outcome (ok, timeout, circuit_open, error, script_error).',
      labelNames: ['operation', 'outcome'],
      buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1],
      registers,
    });
    this.scriptErrors = new Counter({
      name: 'quotaplane_script_errors_total',
      help: 'Store calls Redis refused or answered with an unexpected reply, by operation.',
      labelNames: ['operation'],
      registers,
    });
    this.refunds = new Counter({
      name: 'quotaplane_refunds_total',
      help: 'Refunds of earlier grants after a later slot denied a layered request, by outcome (ok, failed).',
      labelNames: ['outcome'],
      registers,
    });
    this.idempotency = new Counter({
      name: 'quotaplane_idempotent_requests_total',
      help: 'Requests with an idempotency key, by outcome (new, replayed, conflict).',
      labelNames: ['outcome'],
      registers,
    });
    this.requestErrors = new Counter({
      name: 'quotaplane_request_errors_total',
      help: 'Requests answered with an error problem document, by stable code.',
      labelNames: ['code'],
      registers,
    });
    this.breakerState = new Gauge({
      name: 'quotaplane_store_breaker_state',
      help: 'Circuit breaker around the bucket store: 0 closed, 0.5 half-open, 1 open.',
      registers,
    });
    this.breakerTransitions = new Counter({
      name: 'quotaplane_store_breaker_transitions_total',
      help: 'Circuit breaker state changes, by new state.',
      labelNames: ['state'],
      registers,
    });
    this.policies = new Gauge({
      name: 'quotaplane_policies',
      help: 'Policies known to this agent.',
      registers,
    });
    this.policyReloads = new Counter({
      name: 'quotaplane_policy_reloads_total',
      help: 'Policy reloads, by outcome (ok, failed).',
      labelNames: ['outcome'],
      registers,
    });
    if (options.processMetrics ?? true) collectDefaultMetrics({ register: this.registry });
  }

  /** Count one decided check (children are cached: this runs for every check of every request). */
  countDecision(policy: string, allowed: boolean, mode: string): void {
    const key = `${policy}\u0000${allowed ? 1 : 0}\u0000${mode}`;
    let child = this.#decisionChildren.get(key);
    if (child === undefined) {
      child = this.decisions.labels(policy, this.region, allowed ? 'allowed' : 'denied', mode);
      this.#decisionChildren.set(key, child);
    }
    child.inc();
  }
}
