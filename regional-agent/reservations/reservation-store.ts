import type { Clock } from '../../core/clock.js';
import {
  createArguments,
  ReservationModel,
  reservationKey,
  settleArguments,
  type ReservationBody,
  type SettleAction,
  type SettleOutcome,
} from '../../core/models/reservation.js';

/**
 * Where reservations live: Redis (`regional-agent/redis/reservation-store.ts`) or the model (unit tests). Methods
 * throw only when something broke.
 */
export interface ReservationStore {
  /** Record a reservation (`lua/reservation_create.lua`); answers its expiry, µs of the store's time. */
  create(id: string, body: ReservationBody, amountMicros: number, ttlMs: number): Promise<number>;
  /**
   * Settle it once (`lua/reservation_settle.lua`): commit, cancel, expire (the sweep), or abort (a create whose
   * answer never came: `micros` is then the amount charged, and a missing record becomes a tombstone). `attempt`
   * names the call: asked again with the same attempt after its answer was lost, it answers as that call did.
   */
  settle(id: string, action: SettleAction, micros: number, attempt?: string): Promise<SettleOutcome>;
  /** Put it in the region's expiry index (ms), which the sweep reads. */
  index(id: string, dueAtMs: number): Promise<void>;
  /** Ids whose expiry index is at or before `nowMs`, oldest first, at most `limit`. */
  due(nowMs: number, limit: number): Promise<string[]>;
  /** Take it out of the index. */
  unindex(id: string): Promise<void>;
}

/** Reservations on the model and an injected clock. */
export class ModelReservationStore implements ReservationStore {
  readonly model = new ReservationModel();
  readonly #clock: Clock;
  readonly #due = new Map<string, number>();

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  create(id: string, body: ReservationBody, amountMicros: number, ttlMs: number): Promise<number> {
    try {
      return Promise.resolve(
        this.model.create(reservationKey(id), createArguments(body, amountMicros, ttlMs), this.#micros()),
      );
    } catch (error) {
      // A refused create (QP_EXISTS) rejects, as the script's error does.
      return Promise.reject(error instanceof Error ? error : new Error(String(error)));
    }
  }

  settle(id: string, action: SettleAction, micros: number, attempt?: string): Promise<SettleOutcome> {
    return Promise.resolve(
      this.model.settle(reservationKey(id), settleArguments(action, micros, attempt), this.#micros()),
    );
  }

  index(id: string, dueAtMs: number): Promise<void> {
    this.#due.set(id, dueAtMs);
    return Promise.resolve();
  }

  due(nowMs: number, limit: number): Promise<string[]> {
    const ids = [...this.#due].filter(([, at]) => at <= nowMs).sort((a, b) => a[1] - b[1]);
    return Promise.resolve(ids.slice(0, limit).map(([id]) => id));
  }

  unindex(id: string): Promise<void> {
    this.#due.delete(id);
    return Promise.resolve();
  }

  #micros(): number {
    return Math.round(this.#clock.now() * 1000);
  }
}
