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
  readonly decisionsByKind: Counter<'kind' | 'decision'>;
  readonly retryAfter: Histogram<'policy' | 'region'>;
  readonly storeLatency: Histogram<'operation' | 'outcome'>;
  readonly scriptErrors: Counter<'operation'>;
  readonly refunds: Counter<'outcome'>;
  readonly leaseReleases: Counter<'policy' | 'outcome'>;
  readonly grants: Counter<'policy' | 'outcome'>;
  readonly grantTokens: Counter<'policy' | 'flow'>;
  readonly terms: Counter<'policy' | 'outcome'>;
  readonly directTokens: Counter<'policy' | 'outcome'>;
  readonly termsHeld: Gauge;
  readonly reservations: Counter<'outcome'>;
  readonly idempotency: Counter<'outcome'>;
  readonly subjectFlood: Counter<'policy' | 'answer'>;
  readonly subjectsCreated: Counter<'policy'>;
  readonly requestErrors: Counter<'code'>;
  readonly breakerState: Gauge;
  readonly breakerTransitions: Counter<'state'>;
  readonly policies: Gauge;
  readonly policyReloads: Counter<'outcome'>;
  readonly shed: Counter<'region' | 'route' | 'reason' | 'cause'>;
  readonly shedAfterAdmission: Counter<'region' | 'path'>;
  readonly inFlight: Gauge;
  readonly eventLoopDelay: Gauge;
  readonly warmUpSeconds: Gauge;
  /**
   * Decisions counted since the last scrape: a plain number per series, added to the counter when it is read.
   * prom-client hashes the label set on every `inc`, even of a cached child.
   */
  readonly #pendingDecisions = new Tally<'policy' | 'region' | 'decision' | 'mode'>();
  readonly #pendingByKind = new Tally<'kind' | 'decision'>();

  constructor(options: AgentMetricsOptions) {
    this.region = options.region;
    const registers = [this.registry];
    const pending = this.#pendingDecisions;
    const pendingByKind = this.#pendingByKind;
    this.decisions = new Counter({
      name: 'quotaplane_decisions_total',
      help: 'Checks decided, by policy, region, decision (allowed/denied) and policy mode.',
      labelNames: ['policy', 'region', 'decision', 'mode'],
      registers,
      // Runs before every read of the counter (a scrape, `get()`): the counts gathered since are added.
      collect() {
        pending.flush(this);
      },
    });
    this.decisionsByKind = new Counter({
      name: 'quotaplane_decisions_by_kind_total',
      help: 'Checks decided, by policy kind (token_bucket, sliding_log, concurrency, daily) and decision (allowed/denied).',
      labelNames: ['kind', 'decision'],
      registers,
      collect() {
        pendingByKind.flush(this);
      },
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
    this.grants = new Counter({
      name: 'quotaplane_grants_total',
      help: 'Local grant calls, by policy and outcome (granted; dry: nothing to take; returned; unknown: a return naming no live grant; failed: no store answer).',
      labelNames: ['policy', 'outcome'],
      registers,
    });
    this.grantTokens = new Counter({
      name: 'quotaplane_grant_tokens_total',
      help: 'Tokens moved by local grants, by policy and flow (taken out to clients; returned; dropped: no room on return).',
      labelNames: ['policy', 'flow'],
      registers,
    });
    this.terms = new Counter({
      name: 'quotaplane_terms_total',
      help: 'Direct-decision term requests of known policies, by policy and outcome (issued; not_allowed: the policy gives none; unavailable: none now, e.g. no lease, a lease about to lapse, no Redis TIME sample).',
      labelNames: ['policy', 'outcome'],
      registers,
    });
    this.directTokens = new Counter({
      name: 'quotaplane_direct_decision_tokens_total',
      help: 'Tokens clients decided themselves under terms, as they report them with their next term request (tokens, not decisions), by policy and outcome (admitted, refused).',
      labelNames: ['policy', 'outcome'],
      registers,
    });
    this.termsHeld = new Gauge({
      name: 'quotaplane_terms_held',
      help: 'Terms given and not run out yet (the restart hold counts as one): each holds acknowledgements of newer records.',
      registers,
    });
    this.leaseReleases = new Counter({
      name: 'quotaplane_lease_releases_total',
      help: 'Concurrency lease releases, by policy and outcome (released; gone: already released or expired; failed).',
      labelNames: ['policy', 'outcome'],
      registers,
    });
    this.reservations = new Counter({
      name: 'quotaplane_reservations_total',
      help: 'Reservations by outcome: reserved, denied, committed, cancelled, expired (refunded by the sweep or a late settle), aborted (a create whose answer was lost, refunded once), refund_failed.',
      labelNames: ['outcome'],
      registers,
    });
    this.idempotency = new Counter({
      name: 'quotaplane_idempotent_requests_total',
      help: 'Requests with an idempotency key, by outcome (new, replayed, conflict).',
      labelNames: ['outcome'],
      registers,
    });
    this.subjectFlood = new Counter({
      name: 'quotaplane_subject_flood_total',
      help: 'Checks of unseen subjects past the policy subject-creation cap, by policy and flood answer (deny, shared).',
      labelNames: ['policy', 'answer'],
      registers,
    });
    this.subjectsCreated = new Counter({
      name: 'quotaplane_subjects_created_total',
      help: 'Creations taken from a policy subject-creation cap (new subject buckets), by policy.',
      labelNames: ['policy'],
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
    this.shed = new Counter({
      name: 'quotaplane_shed_decisions_total',
      help: 'Decision requests refused before any store call because the agent was overloaded (503 AGT_ERR_OVERLOADED), by route (http, forward_auth, grpc, reservations, leases, explain, strict, loan) and cause (in_flight, event_loop_delay).',
      labelNames: ['region', 'route', 'reason', 'cause'],
      registers,
    });
    this.shedAfterAdmission = new Counter({
      name: 'quotaplane_shed_after_admission_total',
      help: 'Decisions admitted, then shed (503 AGT_ERR_OVERLOADED, nothing charged), by path: local_deadline, forward_timeout, home_late, home_admission, home_store_deadline, home_other, store_deadline (core/wire/agent.ts SHED_PATHS).',
      labelNames: ['region', 'path'],
      registers,
    });
    this.inFlight = new Gauge({
      name: 'quotaplane_in_flight_decisions',
      help: 'Decision requests admitted and not yet answered.',
      registers,
    });
    this.eventLoopDelay = new Gauge({
      name: 'quotaplane_event_loop_delay_seconds',
      help: 'Largest event-loop delay seen over the last sampling interval, as admission control reads it.',
      registers,
    });
    this.warmUpSeconds = new Gauge({
      name: 'quotaplane_warm_up_seconds',
      help: 'How long the warm-up before readiness took (dry-run decisions through the decision path); 0 before it ends or without one.',
      registers,
    });
    if (options.processMetrics ?? true) collectDefaultMetrics({ register: this.registry });
  }

  /** Count one decided check: this runs for every check of every request, so it only adds 1 to a number. */
  countDecision(policy: string, allowed: boolean, mode: string): void {
    const decision = allowed ? 'allowed' : 'denied';
    this.#pendingDecisions.add(this.decisions, `${policy}\0${decision}\0${mode}`, () => ({
      policy,
      region: this.region,
      decision,
      mode,
    }));
  }

  /** Count one decided check by its policy's kind (as cheaply as countDecision). */
  countDecisionByKind(kind: string, allowed: boolean): void {
    const decision = allowed ? 'allowed' : 'denied';
    this.#pendingByKind.add(this.decisionsByKind, `${kind}\0${decision}`, () => ({ kind, decision }));
  }
}

/**
 * Counts added to a counter as plain numbers, one cell per label set, and flushed into it when it is read: a
 * counter's own `inc` hashes the label set on every call, which costs more than the rest of a decision's
 * bookkeeping.
 */
class Tally<L extends string> {
  readonly #cells = new Map<string, { labels: Record<L, string>; count: number }>();

  /** Add 1 to the series `key` names; `labels` makes its label set, the first time only. */
  add(counter: Counter<L>, key: string, labels: () => Record<L, string>): void {
    const cell = this.#cells.get(key);
    if (cell !== undefined) {
      cell.count++;
      return;
    }
    const made = labels();
    // The series exists (at 0) from the first count on, as a child created by `labels()` would.
    counter.inc(made, 0);
    this.#cells.set(key, { labels: made, count: 1 });
  }

  /** Add what was counted since the last flush to `counter`. */
  flush(counter: Counter<L>): void {
    for (const cell of this.#cells.values()) {
      if (cell.count === 0) continue;
      counter.inc(cell.labels, cell.count);
      cell.count = 0;
    }
  }
}
