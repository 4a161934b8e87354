import type { Clock } from '../../core/clock.js';
import { decodeReply, encodeRequest, type DecideRequest, type Decision } from '../../core/wire/bucket.js';
import {
  DAY_RECORD_SUFFIX,
  DailyBudgetModel,
  parseDayRequest,
  type DayRefund,
  type DayReply,
  type DayRequest,
} from '../../core/models/daily-budget.js';
import { RefundableBucketModel, encodeRefund, type RefundRequest } from '../../core/models/refund.js';
import {
  LOG_RECORD_SUFFIX,
  parseLogRequest,
  SlidingLogModel,
  type LogRefund,
  type LogReply,
  type LogRequest,
} from '../../core/models/sliding-log.js';
import {
  CreationLogModel,
  parseCreationRequest,
  type CreationReply,
  type CreationRequest,
} from '../../core/models/subject-creation.js';
import { MICRO } from '../../core/models/token-bucket.js';
import { ModelGrantStore } from '../grants/grant-store.js';
import { ModelReservationStore } from '../reservations/reservation-store.js';
import type { ClaimOutcome, DecisionStore, RefundOutcome, StoreCompanions } from './decision-store.js';
import { REQUEST_CLAIM_SUFFIX } from './idempotency-claim.js';

/**
 * The decision store over the reference models and an injected clock: unit tests, and anything that wants the
 * agent's decision path without Redis. `slotOf` can be given to mimic a cluster's grouping.
 */
export class ModelDecisionStore implements DecisionStore {
  readonly model = new RefundableBucketModel();
  readonly logs = new SlidingLogModel();
  readonly days = new DailyBudgetModel();
  readonly creations = new CreationLogModel();
  readonly #clock: Clock;
  readonly #slotOf: (key: string) => number;
  readonly #claims = new Map<string, { fingerprint: string; expiresAt: number }>();

  constructor(clock: Clock, slotOf: (key: string) => number = () => 0) {
    this.#clock = clock;
    this.#slotOf = slotOf;
  }

  /** Reservations on the model, grants on this store's own buckets, both at `clock`'s time. */
  companions(clock: Clock): StoreCompanions {
    return {
      reservations: new ModelReservationStore(clock),
      grants: new ModelGrantStore(this.model.buckets, clock),
    };
  }

  decide(request: DecideRequest): Promise<Decision> {
    return Promise.resolve(decodeReply(this.model.evaluate(encodeRequest(request), this.#micros())));
  }

  slotOf(key: string): number {
    return this.#slotOf(key);
  }

  decideLog(request: LogRequest): Promise<LogReply> {
    return Promise.resolve(this.logs.evaluate(parseLogRequest(request), this.#micros()));
  }

  refundLog(refund: LogRefund): Promise<{ removed: number[]; recordDeleted: boolean }> {
    return Promise.resolve(this.logs.refund(refund, this.#micros()));
  }

  takeCreation(request: CreationRequest): Promise<CreationReply> {
    return Promise.resolve(this.creations.take(parseCreationRequest(request), this.#micros()));
  }

  // async: a model that throws (a clock outside the days given) rejects, as the store does.
  // eslint-disable-next-line @typescript-eslint/require-await
  async decideDay(request: DayRequest): Promise<DayReply> {
    return this.days.evaluate(parseDayRequest(request), this.#micros());
  }

  refundDay(refund: DayRefund): Promise<{ refunded: number[]; recordDeleted: boolean }> {
    return Promise.resolve(this.days.refund(refund, this.#micros()));
  }

  refund(request: RefundRequest): Promise<RefundOutcome> {
    const reply = this.model.refund(encodeRefund(request), this.#micros());
    return Promise.resolve({
      results: reply.results.map((r) => ({
        refunded: r.refunded / MICRO,
        tokens: r.tokens < 0 ? null : r.tokens / MICRO,
      })),
      recordDeleted: reply.recordDeleted,
    });
  }

  claim(key: string, fingerprint: string, ttlMs: number, peekOnly: boolean): Promise<ClaimOutcome> {
    // A claim of a group's record key lives beside that kind's records, as in Redis, where the scripts read it.
    if (key.endsWith(LOG_RECORD_SUFFIX))
      return Promise.resolve(this.logs.claimRecord(key, fingerprint, ttlMs, this.#micros(), peekOnly));
    if (key.endsWith(DAY_RECORD_SUFFIX))
      return Promise.resolve(this.days.claimRecord(key, fingerprint, ttlMs, this.#micros(), peekOnly));
    if (!key.endsWith(REQUEST_CLAIM_SUFFIX))
      return Promise.resolve(this.model.claimRecord(key, fingerprint, ttlMs, this.#micros(), peekOnly));
    const now = this.#clock.now();
    const held = this.#claims.get(key);
    if (held !== undefined && held.expiresAt > now) {
      return Promise.resolve(held.fingerprint === fingerprint ? 'same' : 'conflict');
    }
    if (!peekOnly) this.#claims.set(key, { fingerprint, expiresAt: now + ttlMs });
    return Promise.resolve('new');
  }

  #micros(): number {
    return Math.round(this.#clock.now() * 1000);
  }
}
