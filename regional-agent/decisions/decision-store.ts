import type { DecideRequest, Decision } from '../../core/wire/bucket.js';
import type { RefundRequest } from '../../core/models/refund.js';
import type { DayRefund, DayReply, DayRequest } from '../../core/models/daily-budget.js';
import type { LogRefund, LogReply, LogRequest } from '../../core/models/sliding-log.js';
import type { CreationReply, CreationRequest } from '../../core/models/subject-creation.js';
import type { Clock } from '../../core/clock.js';
import type { GrantStore } from '../grants/grant-store.js';
import type { ReservationStore } from '../reservations/reservation-store.js';

/**
 * A request that carried its caller's deadline (`chargeBy`) was not run before it: nothing was decided or
 * charged. The caller's budget ran out, not the store: it never counts against the store's breaker.
 */
export class CallerDeadlineError extends Error {
  readonly code = 'QP_CALLER_DEADLINE';
  constructor(message = "the caller's deadline passed before the store could decide: nothing was charged") {
    super(message);
    this.name = 'CallerDeadlineError';
  }
}

/** Options of one decision: `chargeBy` (epoch ms) is the latest instant it may charge; later, nothing is. */
export interface DecideOptions {
  chargeBy?: number | undefined;
}

/** How a whole-request idempotency claim went. */
export type ClaimOutcome = 'new' | 'same' | 'conflict';

/** What a refund gave back, in tokens, per bucket; `tokens` is null when the bucket was gone. */
export interface RefundOutcome {
  results: { refunded: number; tokens: number | null }[];
  recordDeleted: boolean;
}

/**
 * Everything the decision path asks of its bucket store: Redis (or a Redis Cluster) in the agent, an in-memory
 * model in unit tests. Methods throw only when something broke; a denial is a value.
 */
export interface DecisionStore {
  /**
   * Decide one slot's checks all-or-nothing (`lua/token_bucket.lua`). With `chargeBy`, nothing is charged after
   * that instant: the store throws CallerDeadlineError instead.
   */
  decide(request: DecideRequest, options?: DecideOptions): Promise<Decision>;
  /** The cluster slot of a key (0 for every key on a single Redis): checks are grouped by it. */
  slotOf(key: string): number;
  /** Give back what a decision charged (`lua/refund.lua`), deleting its idempotency record when named. */
  refund(request: RefundRequest): Promise<RefundOutcome>;
  /**
   * Claim an idempotency key for a whole request that spans several slots: `new` the first time, `same` when
   * the key already answers this request (same fingerprint), `conflict` when it answers another. With
   * `peekOnly` nothing is written (dry runs).
   */
  claim(key: string, fingerprint: string, ttlMs: number, peekOnly: boolean): Promise<ClaimOutcome>;
  /** Decide one slot's sliding logs all-or-nothing (`lua/sliding_log.lua`). */
  decideLog(request: LogRequest): Promise<LogReply>;
  /** Take back the entries an admitted log call wrote (`lua/sliding_log_refund.lua`). */
  refundLog(refund: LogRefund): Promise<{ removed: number[]; recordDeleted: boolean }>;
  /**
   * Take one creation of a policy's subject-creation cap for one subject (`lua/subject_creation.lua`): counted
   * once per subject within the window, however many callers ask.
   */
  takeCreation(request: CreationRequest): Promise<CreationReply>;
  /** Decide one slot's daily budgets all-or-nothing (`lua/daily_budget.lua`). */
  decideDay(request: DayRequest): Promise<DayReply>;
  /** Give back what an admitted daily call charged (`lua/daily_budget_refund.lua`). */
  refundDay(refund: DayRefund): Promise<{ refunded: number[]; recordDeleted: boolean }>;
  /**
   * What lives beside this store's buckets: reservations, and the local grants that take from the buckets
   * decisions charge. A store without it gets in-memory reservations and no grants route.
   */
  companions?(clock: Clock): StoreCompanions;
}

/** The stores that live beside a decision store's buckets (`DecisionStore.companions`). */
export interface StoreCompanions {
  reservations: ReservationStore;
  grants: GrantStore;
}
