import type { Cluster, Redis, Result } from 'ioredis';
import {
  createArguments,
  parseSettleReply,
  reservationKey,
  RESERVATIONS_DUE_KEY,
  settleArguments,
  type ReservationBody,
  type SettleAction,
  type SettleOutcome,
} from '../../core/models/reservation.js';
import type { ReservationStore } from '../reservations/reservation-store.js';
import { onTheWire } from '../resilience/wire-timeout.js';
import { defineScript, runScript } from './scripts.js';

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** `lua/reservation_create.lua`: number of keys, keys, ARGV. */
    qpReservationCreate(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
    /** `lua/reservation_settle.lua`: number of keys, keys, ARGV. */
    qpReservationSettle(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
  }
}

/** Reservations on one Redis or a Redis Cluster: one hash per reservation, one sorted set as the expiry index. */
export class RedisReservationStore implements ReservationStore {
  readonly redis: Redis | Cluster;
  readonly #timeoutMs: number;

  constructor(redis: Redis | Cluster, options: { timeoutMs?: number } = {}) {
    this.redis = redis;
    this.#timeoutMs = options.timeoutMs ?? 50;
    defineScript(redis, 'reservation_create');
    defineScript(redis, 'reservation_settle');
  }

  async create(id: string, body: ReservationBody, amountMicros: number, ttlMs: number): Promise<number> {
    const raw = await this.#run(
      'qpReservationCreate',
      [reservationKey(id)],
      createArguments(body, amountMicros, ttlMs),
      'reservation create script',
    );
    if (!Array.isArray(raw) || !Number.isSafeInteger(raw[0])) {
      throw new TypeError(`unexpected reservation create reply: ${JSON.stringify(raw)?.slice(0, 100)}`);
    }
    return raw[0] as number;
  }

  async settle(
    id: string,
    action: SettleAction,
    committedMicros: number,
    attempt?: string,
  ): Promise<SettleOutcome> {
    const raw = await this.#run(
      'qpReservationSettle',
      [reservationKey(id)],
      settleArguments(action, committedMicros, attempt),
      'reservation settle script',
    );
    return parseSettleReply(raw);
  }

  async index(id: string, dueAtMs: number): Promise<void> {
    await onTheWire(this.redis.zadd(RESERVATIONS_DUE_KEY, dueAtMs, id), this.#timeoutMs, 'reservation index');
  }

  due(nowMs: number, limit: number): Promise<string[]> {
    return onTheWire(
      this.redis.zrangebyscore(RESERVATIONS_DUE_KEY, '-inf', nowMs, 'LIMIT', 0, limit),
      this.#timeoutMs,
      'reservation sweep',
    );
  }

  async unindex(id: string): Promise<void> {
    await onTheWire(this.redis.zrem(RESERVATIONS_DUE_KEY, id), this.#timeoutMs, 'reservation unindex');
  }

  #run(command: string, keys: string[], argv: string[], what: string): Promise<unknown> {
    return runScript(this.redis, command, keys, argv, this.#timeoutMs, what);
  }
}
