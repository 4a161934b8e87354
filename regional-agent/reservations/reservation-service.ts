/**
 * Reserve-then-commit (docs/reservations.md): a reservation is an ordinary decision that charges `amount` on every
 * check, recorded with an expiry; committing the amount actually used refunds the rest, cancelling refunds it all,
 * and a reservation left unsettled is refunded whole by the region's sweep once it expires. The state moves once,
 * in `lua/reservation_settle.lua`, so exactly one of a commit, a cancel and the sweep refunds.
 *
 * A refund that fails after the state moved is counted and logged, and that grant stands (never more admitted
 * than the budget: a lost refund only costs the subject unused units).
 *
 * A create whose answer did not come (a timeout, a lost connection) may still run in Redis, late: the record is
 * then there, indexed, and the sweep would refund it. So the failure path never refunds on its own once the
 * create was sent: it aborts through the settle script, which moves the state once (a reserved record becomes
 * `aborted`; no record becomes a tombstone a late create refuses on) and tells this agent whether to refund. An
 * abort that gets no answer either is retried by the sweep until it answers (or `ABORT_RETRY_MS` passes: then the
 * grant stands); the sweep may meanwhile expire a record that landed, and that expiry is then the one refund.
 */
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import {
  AMOUNT_MICRO,
  DEFAULT_RESERVATION_SECONDS,
  regionOfReservation,
  ReservationBody,
  ReservationId,
  ReservationRequest,
  settlementRefunds,
  toMicros,
  type Charge,
  type SettleAction,
  type SettledState,
  type SettleOutcome,
  type SettlementResponse,
} from '../../core/models/reservation.js';
import { kindOf } from '../../core/kinds/index.js';
import type { DecisionService, DecisionOutcome } from '../decisions/decision-service.js';
import type { DecisionStore } from '../decisions/decision-store.js';
import { AgentErrors, withProblems } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { ReservationStore } from './reservation-store.js';

export interface ReservationDeps {
  service: DecisionService;
  store: DecisionStore;
  reservations: ReservationStore;
  guard: StoreGuard;
  metrics: AgentMetrics;
  log: Logger;
  region: string;
  /** Wall clock, ms: only to place a reservation in the sweep's index (the expiry itself is Redis time). */
  now: () => number;
}

/** What `reserve` answers: the decision, and the reservation when it admitted. */
export interface Reserved {
  outcome: DecisionOutcome;
  reservation?: { id: string; amount: number; expiresInMs: number } | undefined;
}

/** Most reservations one sweep settles. */
const SWEEP_BATCH = 100;

/**
 * How long an unanswered abort is retried, ms: far inside the retention of a settled record (a day), so a retry
 * never finds a record the sweep settled already gone and takes it for one that never landed.
 */
export const ABORT_RETRY_MS = 3600 * 1000;
/** Most unanswered aborts kept for retry; beyond, a new one's grant stands (counted, logged). */
const MAX_PENDING_ABORTS = 10_000;

/** A reservation whose create may or may not have run, to abort: what its decision charged, and since when. */
interface PendingAbort {
  id: string;
  body: ReservationBody;
  amountMicros: number;
  /** `now()` when the reserve gave up on it. */
  since: number;
}

/**
 * A settlement (commit, cancel, expiry) whose answer never came: it may have moved the state in Redis, and then
 * nobody refunded it (a retry by the client only replays). The sweep asks again with the same attempt: a call
 * that moved the state under it answers again as it did, and is refunded then; one that never ran runs now.
 */
interface PendingSettle {
  id: string;
  action: Exclude<SettleAction, 'abort'>;
  micros: number;
  attempt: string;
  since: number;
}

export class ReservationService {
  readonly #deps: ReservationDeps;
  #timer: NodeJS.Timeout | undefined;
  #sweeping: Promise<number> | undefined;
  /** Aborts that got no answer, by id: the sweep retries them. One is taken out while it is tried. */
  readonly #pendingAborts = new Map<string, PendingAbort>();
  /** Settlements that got no answer, by id and attempt: the sweep asks again. */
  readonly #pendingSettles = new Map<string, PendingSettle>();

  constructor(deps: ReservationDeps) {
    this.#deps = deps;
  }

  /** Validate, decide, and record an admitted reservation. Throws agent errors for bad input. */
  async reserve(body: unknown, requestId: string): Promise<Reserved> {
    const parsed = ReservationRequest.safeParse(body);
    if (!parsed.success) {
      const problems = parsed.error.issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`);
      throw withProblems(new AgentErrors.AGT_ERR_INVALID_RESERVATION(problems.join('; ')), problems);
    }
    const r = parsed.data;
    const checks =
      'checks' in r
        ? r.checks
        : [{ policy: r.policy, subject: r.subject, ...(r.class === undefined ? {} : { class: r.class }) }];
    const { service, metrics } = this.#deps;
    const prepared = service.prepare({ checks: checks.map((c) => ({ ...c, cost: r.amount })) });
    for (const p of prepared.checks) {
      // Never from an emergency bucket (`local`): what a reservation took there nothing gives back (a settlement
      // refunds the store), and a reserve the store cannot record answers 503 after taking it. Closed instead.
      if (p.policy.onStoreFailure === 'local') p.policy = { ...p.policy, onStoreFailure: 'closed' };
      const traits = kindOf(p.policy.kind);
      if (!traits.reservations) {
        throw new AgentErrors.AGT_ERR_INVALID_RESERVATION(
          traits.leases
            ? `${p.policy.name} is a ${p.policy.kind} policy: hold its slots with a lease, not a reservation`
            : `${p.policy.name} is a ${p.policy.kind} policy, which takes no reservations`,
        );
      }
      if (p.route === 'forward') {
        throw new AgentErrors.AGT_ERR_INVALID_RESERVATION(
          `${p.policy.name} is a strict policy homed in ${p.homeRegion}: reserve it at that region's agent`,
        );
      }
    }
    const outcome = await service.decide({ ...prepared, reservation: true }, requestId);
    if (!outcome.allowed) {
      metrics.reservations.labels('denied').inc();
      return { outcome };
    }
    // What each check charged in this region's store (forwarded checks and failure modes charged nothing here).
    const charges = outcome.checks.flatMap((c): Charge[] => (c.charge === undefined ? [] : [c.charge]));
    const reservationBody = ReservationBody.parse({ region: this.#deps.region, charges });
    const id = `${this.#deps.region}.${randomBytes(16).toString('base64url')}`;
    const ttlMs = (r.ttlSeconds ?? DEFAULT_RESERVATION_SECONDS) * 1000;
    const amountMicros = toMicros(r.amount);
    let createSent = false;
    try {
      // Indexed first: a record is never left out of the sweep (an index entry without a record is dropped).
      await this.#deps.guard.run('reservation', () =>
        this.#deps.reservations.index(id, this.#deps.now() + ttlMs),
      );
      await this.#deps.guard.run('reservation', () => {
        createSent = true;
        return this.#deps.reservations.create(id, reservationBody, amountMicros, ttlMs);
      });
    } catch (error) {
      if (!createSent) {
        // No create went out, so no record can appear: give the units back now.
        await this.#refund(reservationBody, amountMicros, 0);
        this.#deps.log.warn({ err: error }, 'reservation not recorded: its decision was refunded');
      } else {
        // The create may still land (or have landed, its answer lost): abort it, refunding exactly once.
        const pending = { id, body: reservationBody, amountMicros, since: this.#deps.now() };
        if (!(await this.#abort(pending))) this.#retryLater(pending);
        this.#deps.log.warn({ err: error, id }, 'reservation not recorded: it was aborted');
      }
      throw new AgentErrors.AGT_ERR_STORE_UNAVAILABLE('the reservation could not be recorded');
    }
    metrics.reservations.labels('reserved').inc();
    return { outcome, reservation: { id, amount: r.amount, expiresInMs: ttlMs } };
  }

  /** Commit `amount` (0..reserved) and refund the rest; the same commit again answers the same. */
  commit(id: string, amount: number): Promise<SettlementResponse> {
    return this.#settle(id, 'commit', amount);
  }

  /** Cancel: refund everything; a repeat answers the same. */
  cancel(id: string): Promise<SettlementResponse> {
    return this.#settle(id, 'cancel', 0);
  }

  async #settle(id: string, action: 'commit' | 'cancel', amount: number): Promise<SettlementResponse> {
    if (!ReservationId.safeParse(id).success)
      throw new AgentErrors.AGT_ERR_INVALID_RESERVATION('not a reservation id');
    const region = regionOfReservation(id);
    if (region !== this.#deps.region) throw new AgentErrors.AGT_ERR_WRONG_REGION('reservation', region);
    const committedMicros = toMicros(amount);
    const attempt = randomBytes(12).toString('base64url');
    let sent = false;
    let outcome;
    try {
      outcome = await this.#deps.guard.run('reservation', () => {
        sent = true;
        return this.#deps.reservations.settle(id, action, committedMicros, attempt);
      });
    } catch {
      // Sent, it may have run: the sweep asks again under the same attempt and refunds what it settled.
      if (sent) this.#settleLater({ id, action, micros: committedMicros, attempt, since: this.#deps.now() });
      throw new AgentErrors.AGT_ERR_STORE_UNAVAILABLE('the reservation could not be settled');
    }
    const units = (micros: number) => micros / AMOUNT_MICRO;
    switch (outcome.kind) {
      case 'missing':
        throw new AgentErrors.AGT_ERR_UNKNOWN_RESERVATION(id);
      case 'above':
        throw new AgentErrors.AGT_ERR_COMMIT_ABOVE_RESERVED(amount, units(outcome.reservedMicros));
      case 'not_due':
      case 'tombstoned':
        throw new TypeError(`a commit or cancel is never ${outcome.kind}`);
      case 'expired':
        await this.#finish(id, outcome.body, outcome.reservedMicros, 0, 'expired');
        throw new AgentErrors.AGT_ERR_RESERVATION_EXPIRED(id);
      case 'conflict':
        throw new AgentErrors.AGT_ERR_RESERVATION_SETTLED(id, outcome.state);
      case 'replay':
      case 'settled': {
        if (outcome.state === 'aborted') throw new TypeError('a commit or cancel never aborts');
        if (outcome.kind === 'settled') {
          await this.#finish(
            id,
            outcome.body,
            outcome.reservedMicros,
            outcome.committedMicros,
            outcome.state,
          );
        }
        const state = outcome.state === 'expired' ? 'cancelled' : outcome.state;
        return {
          id,
          state,
          reserved: units(outcome.reservedMicros),
          committed: units(outcome.committedMicros),
          refunded: units(outcome.reservedMicros - outcome.committedMicros),
          replayed: outcome.kind === 'replay',
        };
      }
    }
  }

  /**
   * Retry the aborts that got no answer, then settle the reservations whose expiry passed: each refunded whole,
   * once. Answers how many it expired.
   */
  async sweep(): Promise<number> {
    const { reservations, guard } = this.#deps;
    await this.#retryAborts();
    await this.#retrySettles();
    const ids = await guard.run('reservation', () => reservations.due(this.#deps.now(), SWEEP_BATCH));
    let expired = 0;
    for (const id of ids) {
      const attempt = randomBytes(12).toString('base64url');
      let sent = false;
      let outcome;
      try {
        outcome = await guard.run('reservation', () => {
          sent = true;
          return reservations.settle(id, 'expire', 0, attempt);
        });
      } catch (error) {
        if (sent) this.#settleLater({ id, action: 'expire', micros: 0, attempt, since: this.#deps.now() });
        throw error;
      }
      if (outcome.kind === 'not_due') continue;
      if (outcome.kind === 'settled') {
        await this.#finish(id, outcome.body, outcome.reservedMicros, 0, 'expired');
        expired++;
      } else {
        await guard.run('reservation', () => reservations.unindex(id));
      }
    }
    return expired;
  }

  /** Sweep every `everyMs` until `stop`; a sweep that fails is logged, the next one tries again. */
  start(everyMs: number): void {
    this.#timer ??= setInterval(() => {
      if (this.#sweeping !== undefined) return;
      this.#sweeping = this.sweep()
        .catch((error: unknown) => {
          this.#deps.log.warn({ err: error }, 'reservation sweep failed');
          return 0;
        })
        .finally(() => {
          this.#sweeping = undefined;
        });
    }, everyMs);
    this.#timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    this.#timer = undefined;
    await this.#sweeping;
  }

  /** Aborts waiting for an answer: how many (for tests and diagnostics). */
  get pendingAborts(): number {
    return this.#pendingAborts.size;
  }

  /**
   * Abort a reservation whose create may or may not have run. Answers false when the abort got no answer (retry
   * it), true when it is done: refunded here exactly once, or settled (and refunded) by someone else first.
   */
  async #abort(p: PendingAbort): Promise<boolean> {
    const { reservations, guard, log } = this.#deps;
    let outcome;
    try {
      outcome = await guard.run('reservation', () => reservations.settle(p.id, 'abort', p.amountMicros));
    } catch (error) {
      log.warn({ err: error, id: p.id }, 'reservation abort got no answer: the sweep retries it');
      return false;
    }
    switch (outcome.kind) {
      case 'settled': // the create landed; this abort settled it
      case 'tombstoned': // it had not landed; it never will now
      case 'replay': // an earlier abort landed but its answer was lost: nothing was refunded yet
        await this.#finish(p.id, p.body, p.amountMicros, 0, 'aborted');
        return true;
      default:
        // Settled otherwise first (the sweep expired the late record): that settlement refunded.
        await guard.run('reservation', () => reservations.unindex(p.id)).catch(() => undefined);
        return true;
    }
  }

  #retryLater(p: PendingAbort): void {
    if (this.#pendingAborts.size >= MAX_PENDING_ABORTS) {
      this.#abandon(p, 'too many reservation aborts waiting: this one is dropped and its grant stands');
      return;
    }
    this.#pendingAborts.set(p.id, p);
  }

  #abandon(p: PendingAbort, message: string): void {
    this.#deps.metrics.reservations.labels('refund_failed').inc();
    this.#deps.log.warn({ id: p.id }, message);
  }

  /**
   * One more try of the oldest unanswered aborts (at most a sweep's batch, and none after one goes unanswered
   * again: the store is unwell). Each is out of the map while it is tried, so only one try refunds.
   */
  async #retryAborts(): Promise<void> {
    for (const p of [...this.#pendingAborts.values()].slice(0, SWEEP_BATCH)) {
      if (!this.#pendingAborts.delete(p.id)) continue;
      if (this.#deps.now() - p.since > ABORT_RETRY_MS) {
        this.#abandon(p, 'reservation abort unanswered for too long: its grant stands');
        continue;
      }
      if (!(await this.#abort(p))) {
        this.#retryLater(p);
        return;
      }
    }
  }

  #settleLater(p: PendingSettle): void {
    if (this.#pendingAborts.size + this.#pendingSettles.size >= MAX_PENDING_ABORTS) {
      this.#deps.metrics.reservations.labels('refund_failed').inc();
      this.#deps.log.warn(
        { id: p.id },
        'too many unanswered settlements waiting: this one may not be refunded',
      );
      return;
    }
    this.#pendingSettles.set(`${p.id}\u0000${p.attempt}`, p);
  }

  /**
   * Ask again, under the same attempt, the settlements that got no answer (at most a sweep's batch, none after
   * one goes unanswered again). Each is out of the map while it is asked, so only one answer refunds.
   */
  async #retrySettles(): Promise<void> {
    const { reservations, guard } = this.#deps;
    for (const [key, p] of [...this.#pendingSettles].slice(0, SWEEP_BATCH)) {
      if (!this.#pendingSettles.delete(key)) continue;
      if (this.#deps.now() - p.since > ABORT_RETRY_MS) {
        this.#deps.metrics.reservations.labels('refund_failed').inc();
        this.#deps.log.warn({ id: p.id }, 'reservation settlement unanswered for too long: its grant stands');
        continue;
      }
      let outcome: SettleOutcome;
      try {
        outcome = await guard.run('reservation', () =>
          reservations.settle(p.id, p.action, p.micros, p.attempt),
        );
      } catch {
        this.#pendingSettles.set(key, p);
        return;
      }
      if (outcome.kind === 'settled' && outcome.state !== 'aborted') {
        await this.#finish(
          p.id,
          outcome.body,
          outcome.reservedMicros,
          outcome.committedMicros,
          outcome.state,
        );
      } else if (outcome.kind === 'expired') {
        await this.#finish(p.id, outcome.body, outcome.reservedMicros, 0, 'expired');
      }
      // Anything else: settled by another call first, which refunded it (or the record is gone).
    }
  }

  /** After the state moved: refund the unused part, count the settlement, drop the index entry. */
  async #finish(
    id: string,
    body: string | ReservationBody,
    reservedMicros: number,
    committedMicros: number,
    state: SettledState,
  ): Promise<void> {
    let parsed: ReservationBody | undefined;
    try {
      parsed = typeof body === 'string' ? ReservationBody.parse(JSON.parse(body)) : body;
    } catch (error) {
      this.#deps.log.error({ err: error, id }, 'reservation record unreadable: its grant stands');
    }
    if (parsed !== undefined) await this.#refund(parsed, reservedMicros, committedMicros);
    this.#deps.metrics.reservations.labels(state).inc();
    await this.#deps.guard
      .run('reservation', () => this.#deps.reservations.unindex(id))
      .catch(() => undefined); // The sweep drops it later: settled records answer conflict there.
  }

  async #refund(body: ReservationBody, reservedMicros: number, committedMicros: number): Promise<void> {
    const { store, guard, metrics, log } = this.#deps;
    for (const refund of settlementRefunds(body, reservedMicros, committedMicros)) {
      try {
        if (refund.kind === 'bucket') await guard.run('refund', () => store.refund(refund.request));
        else if (refund.kind === 'day') await guard.run('refund', () => store.refundDay(refund.refund));
        else await guard.run('refund', () => store.refundLog(refund.refund));
      } catch (error) {
        metrics.reservations.labels('refund_failed').inc();
        log.warn({ err: error }, 'reservation refund failed: that grant stands');
      }
    }
  }
}
