/**
 * Where local grants take and hand back tokens (`lua/grant.lua`): the subject's own bucket, the one decisions
 * charge. On Redis, or on the in-memory model store's buckets (core/models/grant.ts, the script's model).
 */
import type { Cluster, Redis, Result } from 'ioredis';
import type { Clock } from '../../core/clock.js';
import {
  grantArguments,
  parseReturnReply,
  parseTakeReply,
  returnOnModel,
  takeOnModel,
  type EncodedGrant,
  type EncodedReturnResult,
  type EncodedTakeResult,
} from '../../core/models/grant.js';
import type { BucketModel } from '../../core/models/token-bucket.js';
import { DEFAULT_STORE_TIMEOUT_MS } from '../config.js';
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

export class RedisGrantStore implements GrantStore {
  readonly #redis: Redis | Cluster;
  readonly #timeoutMs: number;

  constructor(redis: Redis | Cluster, options: { timeoutMs?: number } = {}) {
    this.#redis = redis;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
    defineScript(redis, 'grant');
  }

  async take(grant: EncodedGrant): Promise<EncodedTakeResult> {
    const { keys, argv } = grantArguments('take', grant);
    return parseTakeReply(
      await runScript(this.#redis, 'qpGrant', keys, argv, this.#timeoutMs, 'grant script'),
    );
  }

  async giveBack(grant: EncodedGrant): Promise<EncodedReturnResult> {
    const { keys, argv } = grantArguments('return', grant);
    return parseReturnReply(
      await runScript(this.#redis, 'qpGrant', keys, argv, this.#timeoutMs, 'grant script'),
    );
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
