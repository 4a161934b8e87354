import type { Cluster, Redis, Result } from 'ioredis';
import type { DecideRequest, Decision } from '../../core/wire/bucket.js';
import {
  encodeRefund,
  parseRefundReply,
  refundArguments,
  type RefundRequest,
} from '../../core/models/refund.js';
import type { LogRefund, LogReply, LogRequest } from '../../core/models/sliding-log.js';
import {
  creationArguments,
  parseCreationReply,
  parseCreationRequest,
  type CreationReply,
  type CreationRequest,
} from '../../core/models/subject-creation.js';
import { MICRO } from '../../core/models/token-bucket.js';
import type { Clock } from '../../core/clock.js';
import { RedisGrantStore } from '../grants/grant-store.js';
import { RedisReservationStore } from './reservation-store.js';
import type {
  ClaimOutcome,
  DecideOptions,
  DecisionStore,
  RefundOutcome,
  StoreCompanions,
} from '../decisions/decision-store.js';
import { onTheWire } from '../resilience/wire-timeout.js';
import { RedisBucketStore, type RedisBucketStoreOptions } from './bucket-store.js';
import { DEFAULT_STORE_TIMEOUT_MS } from '../config.js';
import { agentMicros, type RedisClock } from './redis-clock.js';
import { defineScript, ReplicaAckError, runScript } from './scripts.js';
import { RedisSlidingLogStore } from './sliding-log-store.js';
import { RedisDailyStore } from './daily-store.js';
import type { DayRefund, DayReply, DayRequest } from '../../core/models/daily-budget.js';

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** `lua/refund.lua`: first argument is the number of keys, then keys, then ARGV. */
    qpRefund(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
  }
}

/** The agent's store on Redis: decisions through RedisBucketStore, refunds through `lua/refund.lua`. */
export class RedisDecisionStore implements DecisionStore {
  readonly redis: Redis | Cluster;
  readonly buckets: RedisBucketStore;
  readonly logs: RedisSlidingLogStore;
  readonly days: RedisDailyStore;
  /** Longest wait for a reply on the wire, ms (other stores on the same connection use it too). */
  readonly timeoutMs: number;
  readonly #timeoutMs: number;
  readonly #clock: RedisClock | undefined;
  readonly #creationCommand: string;
  readonly #refundCommand: string;

  constructor(redis: Redis | Cluster, options: RedisBucketStoreOptions = {}) {
    this.redis = redis;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
    this.timeoutMs = this.#timeoutMs;
    this.buckets = new RedisBucketStore(redis, options);
    this.logs = new RedisSlidingLogStore(redis, options);
    this.days = new RedisDailyStore(redis, options);
    this.#clock = options.clock;
    this.#creationCommand = defineScript(redis, 'subject_creation');
    this.#refundCommand = defineScript(redis, 'refund');
  }

  decide(request: DecideRequest, options?: DecideOptions): Promise<Decision> {
    return this.#forgetUnacknowledged(this.buckets.decide(request, options), request.idempotency?.key);
  }

  /**
   * A call whose writes no replica acknowledged in time (QP_REDIS_WAIT_REPLICAS) is answered as a store failure,
   * its charge kept on the master: its idempotency record goes too. Kept, a retry replayed as an admission a call
   * its caller was told failed, and the retry of a several-group request found that record beside groups decided
   * afresh and was refused as racing its first call (409) for the record's whole life (found by review). Without
   * it the retry is decided afresh: at worst charged twice for one admission, never admitted on nothing.
   */
  async #forgetUnacknowledged<T>(decided: Promise<T>, recordKey: string | undefined): Promise<T> {
    try {
      return await decided;
    } catch (error) {
      if (error instanceof ReplicaAckError && recordKey !== undefined)
        await onTheWire(this.redis.del(recordKey), this.#timeoutMs, 'idempotency record removal').catch(
          () => undefined,
        );
      throw error;
    }
  }

  slotOf(key: string): number {
    return this.buckets.slotOf(key);
  }

  /** Reservations and grants on the same Redis, with the same wire timeout. */
  companions(_clock: Clock): StoreCompanions {
    const options = { timeoutMs: this.timeoutMs };
    return {
      reservations: new RedisReservationStore(this.redis, options),
      grants: new RedisGrantStore(this.redis, options),
    };
  }

  decideLog(request: LogRequest): Promise<LogReply> {
    return this.#forgetUnacknowledged(this.logs.decide(request), request.idempotency?.key);
  }

  refundLog(refund: LogRefund): Promise<{ removed: number[]; recordDeleted: boolean }> {
    return this.logs.refund(refund);
  }

  async takeCreation(request: CreationRequest): Promise<CreationReply> {
    const parsed = parseCreationRequest(request);
    const deadline = this.#clock?.toRedisMicros(agentMicros() + this.#timeoutMs * 1000) ?? 0;
    const { keys, argv } = creationArguments(parsed, Math.round(deadline));
    const raw = await runScript(
      this.redis,
      this.#creationCommand,
      keys,
      argv,
      this.#timeoutMs,
      'subject-creation script',
    );
    return parseCreationReply(raw);
  }

  decideDay(request: DayRequest): Promise<DayReply> {
    return this.#forgetUnacknowledged(this.days.decide(request), request.idempotency?.key);
  }

  refundDay(refund: DayRefund): Promise<{ refunded: number[]; recordDeleted: boolean }> {
    return this.days.refund(refund);
  }

  async refund(request: RefundRequest): Promise<RefundOutcome> {
    const encoded = encodeRefund(request);
    const { keys, argv } = refundArguments(encoded);
    const raw = await runScript(
      this.redis,
      this.#refundCommand,
      keys,
      argv,
      this.#timeoutMs,
      'refund script',
    );
    const reply = parseRefundReply(raw, encoded.checks.length);
    return {
      results: reply.results.map((r) => ({
        refunded: r.refunded / MICRO,
        tokens: r.tokens < 0 ? null : r.tokens / MICRO,
      })),
      recordDeleted: reply.recordDeleted,
    };
  }

  async claim(key: string, fingerprint: string, ttlMs: number, peekOnly: boolean): Promise<ClaimOutcome> {
    // SET NX GET (Redis ≥ 7.0): one round trip that claims the key or returns who holds it.
    const previous = await onTheWire(
      peekOnly
        ? this.redis.get(key)
        : (this.redis.call('SET', key, fingerprint, 'PX', String(ttlMs), 'NX', 'GET') as Promise<
            string | null
          >),
      this.#timeoutMs,
      'idempotency claim',
    );
    if (previous === null) return 'new';
    return previous === fingerprint ? 'same' : 'conflict';
  }
}
