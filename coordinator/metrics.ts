/**
 * The coordinator's Prometheus metrics, in a registry of their own so several coordinators (and agents) can
 * live in one test process. No label ever holds a token, a subject or a free-form value.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export class CoordinatorMetrics {
  readonly registry: Registry;
  /** HTTP requests by route pattern (never the raw URL), method and status. */
  readonly requests: Counter<'route' | 'method' | 'status'>;
  readonly requestSeconds: Histogram<'route' | 'method'>;
  /** Problems answered, by stable code. */
  readonly problems: Counter<'code'>;
  /** Refused credentials: `missing`, `invalid` (401) or `forbidden` (403). */
  readonly authFailures: Counter<'reason'>;
  /** Policies in the store, as last counted. */
  readonly policies: Gauge;
  /** Policy changes written, by kind. */
  readonly policyChanges: Counter<'kind'>;
  /** Failed JetStream KV operations, by operation. */
  readonly kvErrors: Counter<'op'>;
  /** Audit records that could not be written after the change they describe was stored. */
  readonly auditFailures: Counter;
  /** Stored entries that failed validation and were skipped (bucket or audit), by where. */
  readonly badEntries: Counter<'where'>;

  constructor(options: { defaultMetrics?: boolean } = {}) {
    const registry = new Registry();
    this.registry = registry;
    const registers = [registry];
    this.requests = new Counter({
      name: 'qp_coord_http_requests_total',
      help: 'Admin API requests by route, method and status.',
      labelNames: ['route', 'method', 'status'],
      registers,
    });
    this.requestSeconds = new Histogram({
      name: 'qp_coord_http_request_duration_seconds',
      help: 'Admin API request duration by route and method.',
      labelNames: ['route', 'method'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    });
    this.problems = new Counter({
      name: 'qp_coord_problems_total',
      help: 'Problem responses by stable error code.',
      labelNames: ['code'],
      registers,
    });
    this.authFailures = new Counter({
      name: 'qp_coord_auth_failures_total',
      help: 'Refused credentials: missing or invalid token (401), read token used to write (403).',
      labelNames: ['reason'],
      registers,
    });
    this.policies = new Gauge({
      name: 'qp_coord_policies',
      help: 'Policies in the store.',
      registers,
    });
    this.policyChanges = new Counter({
      name: 'qp_coord_policy_changes_total',
      help: 'Policy changes written, by kind (create, replace, budget, delete).',
      labelNames: ['kind'],
      registers,
    });
    this.kvErrors = new Counter({
      name: 'qp_coord_kv_errors_total',
      help: 'Failed JetStream KV or stream operations, by operation.',
      labelNames: ['op'],
      registers,
    });
    this.auditFailures = new Counter({
      name: 'qp_coord_audit_failures_total',
      help: 'Audit records not written although the change they describe was stored (logged in full).',
      registers,
    });
    this.badEntries = new Counter({
      name: 'qp_coord_bad_entries_total',
      help: 'Stored entries that failed validation and were skipped, by where (policies, audit).',
      labelNames: ['where'],
      registers,
    });
    if (options.defaultMetrics === true) collectDefaultMetrics({ register: registry, prefix: 'qp_coord_' });
  }
}
