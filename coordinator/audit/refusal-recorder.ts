/**
 * Admin requests refused for their credentials, into the audit trail without letting a flood of them push the
 * real history out (the trail is bounded: the oldest records go first). Refusals are grouped per source address,
 * reason and token name within a window: one record per group, carrying the count, written when the window ends.
 * At most `perMinute` records are written per minute; groups beyond that are only counted
 * (`qp_coord_audit_refusals_dropped_total`) and logged. Every refusal is still counted in
 * `qp_coord_auth_failures_total`.
 */
import { Counter } from 'prom-client';
import type { AuditActor, AuditRecord, RefusalReason } from '../../core/wire/admin.js';
import type { Clock } from '../../core/clock.js';
import type { CoordinatorMetrics } from '../metrics.js';
import type { Logger } from '../ports.js';
import type { AuditTrail } from './audit-trail.js';

/** One refused request. */
export interface Refusal {
  reason: RefusalReason;
  /** The token's principal for `forbidden` (a read token that writes); none otherwise. */
  actor: AuditActor;
  source: string;
  method: string;
  /** The route pattern (never the raw URL). */
  route: string;
  /** The policy the request named, if any. */
  policy: string | undefined;
  requestId: string;
}

interface Group {
  first: Refusal;
  at: number;
  attempts: number;
}

export interface RefusalRecorderOptions {
  audit: AuditTrail;
  clock: Clock;
  metrics: CoordinatorMetrics;
  log: Logger;
  windowMs: number;
  perMinute: number;
}

const MAX_GROUPS = 10_000;

export class RefusalRecorder {
  readonly #options: RefusalRecorderOptions;
  readonly #groups = new Map<string, Group>();
  readonly #dropped: Counter;
  readonly #timer: NodeJS.Timeout;
  #minuteStart = 0;
  #writtenThisMinute = 0;
  #pending: Promise<unknown> = Promise.resolve();

  constructor(options: RefusalRecorderOptions) {
    this.#options = options;
    const registry = options.metrics.registry;
    this.#dropped =
      (registry.getSingleMetric('qp_coord_audit_refusals_dropped_total') as Counter | undefined) ??
      new Counter({
        name: 'qp_coord_audit_refusals_dropped_total',
        help: 'Groups of refused admin requests not written to the audit trail (over the per-minute cap).',
        registers: [registry],
      });
    this.#timer = setInterval(() => void this.flush(), options.windowMs);
    this.#timer.unref();
  }

  /** Note one refused request. */
  note(refusal: Refusal): void {
    const key = `${refusal.source}\u0000${refusal.reason}\u0000${refusal.actor.name}`;
    const group = this.#groups.get(key);
    if (group !== undefined) {
      group.attempts++;
      return;
    }
    if (this.#groups.size >= MAX_GROUPS) {
      this.#dropped.inc();
      return;
    }
    this.#groups.set(key, { first: refusal, at: this.#options.clock.now(), attempts: 1 });
  }

  /** Write the groups of the window that ended (the timer calls this; tests and shutdown may too). */
  flush(): Promise<unknown> {
    const { audit, clock, log, perMinute } = this.#options;
    const now = clock.now();
    if (now - this.#minuteStart >= 60_000) {
      this.#minuteStart = now;
      this.#writtenThisMinute = 0;
    }
    const writes: Promise<void>[] = [];
    for (const { first, at, attempts } of this.#groups.values()) {
      if (this.#writtenThisMinute >= perMinute) {
        this.#dropped.inc();
        log.warn(
          { source: first.source, reason: first.reason, attempts },
          'refused admin requests not audited: over the per-minute cap',
        );
        continue;
      }
      this.#writtenThisMinute++;
      const record: AuditRecord = {
        at: new Date(at).toISOString(),
        actor: first.actor,
        action: 'refused',
        ...(first.policy !== undefined ? { policy: first.policy } : {}),
        before: null,
        after: null,
        requestId: first.requestId,
        source: first.source,
        refused: { reason: first.reason, method: first.method, route: first.route, attempts },
      };
      writes.push(
        audit.record(record).catch((error: unknown) => {
          this.#options.metrics.auditFailures.inc();
          log.error({ err: error, audit: record }, 'could not write an audit record');
        }),
      );
    }
    this.#groups.clear();
    this.#pending = Promise.all(writes);
    return this.#pending;
  }

  /** Stop the timer and write what is left. */
  async close(): Promise<void> {
    clearInterval(this.#timer);
    await this.flush();
  }
}
