/**
 * Where local grants take and hand back tokens (`lua/grant.lua`): the subject's own bucket, the one decisions
 * charge. On Redis, or on the in-memory model store's buckets (core/models/grant.ts, the script's model).
 *
 * On Redis the takes and returns that arrive in one event-loop turn (a client's `POST /v1/grants/batch`, or
 * concurrent single calls) leave together: one script call per cluster slot, up to MAX_GRANT_OPS_PER_CALL
 * operations, run in arrival order at one instant, exactly as separate calls would be.
 */
import calculateSlot from 'cluster-key-slot';
import { Cluster, type Redis, type Result } from 'ioredis';
import type { Clock } from '../../core/clock.js';
import {
  MAX_GRANT_OPS_PER_CALL,
  grantBatchArguments,
  parseBatchReply,
  returnOnModel,
  takeOnModel,
  type EncodedGrant,
  type EncodedReturnResult,
  type EncodedTakeResult,
  type GrantOp,
} from '../../core/models/grant.js';
import type { BucketModel } from '../../core/models/token-bucket.js';
import { DEFAULT_STORE_TIMEOUT_MS } from '../config.js';
import { rideAlong } from '../redis/bucket-store.js';
import { defineScript, runScript } from '../redis/scripts.js';

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** `lua/grant.lua`: number of keys, keys, ARGV. */
    qpGrant(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
  }
}

export interface GrantStore {
  /** Take up to `grant.amount` micro-tokens out of the bucket. */
  take(grant: EncodedGrant): Promise<EncodedTakeResult>;
  /** Hand `grant.amount` micro-tokens back (what fits under the ceiling; the rest is dropped). */
  giveBack(grant: EncodedGrant): Promise<EncodedReturnResult>;
}

interface Waiting extends GrantOp {
  resolve: (result: EncodedTakeResult | EncodedReturnResult) => void;
  reject: (error: unknown) => void;
}

export class RedisGrantStore implements GrantStore {
  readonly #redis: Redis | Cluster;
  readonly #timeoutMs: number;
  readonly #cluster: boolean;
  /** Operations of this event-loop turn, by cluster slot (0 on a single Redis), in arrival order. */
  #waiting = new Map<number, Waiting[]>();
  #flushScheduled = false;
  /** Script calls made so far (tests count them). */
  calls = 0;

  constructor(redis: Redis | Cluster, options: { timeoutMs?: number } = {}) {
    this.#redis = redis;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
    this.#cluster = redis instanceof Cluster;
    defineScript(redis, 'grant');
  }

  take(grant: EncodedGrant): Promise<EncodedTakeResult> {
    return this.#enqueue('take', grant) as Promise<EncodedTakeResult>;
  }

  giveBack(grant: EncodedGrant): Promise<EncodedReturnResult> {
    return this.#enqueue('return', grant) as Promise<EncodedReturnResult>;
  }

  #enqueue(mode: GrantOp['mode'], grant: EncodedGrant): Promise<EncodedTakeResult | EncodedReturnResult> {
    const slot = this.#cluster ? calculateSlot(grant.key) : 0;
    return new Promise((resolve, reject) => {
      let lane = this.#waiting.get(slot);
      if (lane === undefined) this.#waiting.set(slot, (lane = []));
      lane.push({ mode, grant, resolve, reject });
      if (!this.#flushScheduled) {
        this.#flushScheduled = true;
        setImmediate(this.#flush);
      }
    });
  }

  readonly #flush = (): void => {
    this.#flushScheduled = false;
    const waiting = this.#waiting;
    this.#waiting = new Map();
    for (const lane of waiting.values()) {
      for (let i = 0; i < lane.length; i += MAX_GRANT_OPS_PER_CALL)
        void this.#call(lane.slice(i, i + MAX_GRANT_OPS_PER_CALL));
    }
  };

  /**
   * One script call for `ops`: each is answered with its own result. The call is the store's unit of health, so
   * the answers after the first ride along (the store breaker counts the call once), and a failed call rejects
   * every operation with the same error object (counted once too).
   */
  async #call(ops: Waiting[]): Promise<void> {
    this.calls++;
    try {
      const { keys, argv } = grantBatchArguments(ops);
      const raw = await runScript(this.#redis, 'qpGrant', keys, argv, this.#timeoutMs, 'grant script');
      const results = parseBatchReply(
        raw,
        ops.map((o) => o.mode),
      );
      ops.forEach((o, i) => o.resolve(i === 0 ? results[i]! : rideAlong(results[i]!)));
    } catch (error) {
      for (const o of ops) o.reject(error);
    }
  }
}

/** Grants on an in-memory bucket model (the agent's model store), at the clock's time. */
export class ModelGrantStore implements GrantStore {
  readonly #model: BucketModel;
  readonly #clock: Clock;

  constructor(model: BucketModel, clock: Clock) {
    this.#model = model;
    this.#clock = clock;
  }

  take(grant: EncodedGrant): Promise<EncodedTakeResult> {
    return Promise.resolve(takeOnModel(this.#model, grant, Math.round(this.#clock.now() * 1000)));
  }

  giveBack(grant: EncodedGrant): Promise<EncodedReturnResult> {
    return Promise.resolve(returnOnModel(this.#model, grant, Math.round(this.#clock.now() * 1000)));
  }
}
