import calculateSlot from 'cluster-key-slot';
import { Cluster, type Redis, type Result } from 'ioredis';
import type { BucketStore } from '../../core/bucket-store.js';
import {
  decodeReply,
  encodeRequest,
  parseReply,
  scriptArguments,
  type DecideRequest,
  type Decision,
} from '../../core/bucket-wire.js';
import { luaSource } from './scripts.js';

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** `lua/token_bucket.lua`: first argument is the number of keys, then keys, then ARGV. */
    qpTokenBucket(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
  }
}

/** A layered check whose keys hash to different cluster slots: one script cannot decide it. */
export class CrossSlotError extends Error {
  readonly code = 'QP_CROSS_SLOT';
  readonly slots: readonly number[];
  constructor(slots: readonly number[]) {
    super(`keys of one script call span cluster slots ${slots.join(', ')}; split the call per subject`);
    this.name = 'CrossSlotError';
    this.slots = slots;
  }
}

/** The Redis refused or failed the script (as opposed to denying a request). */
export class ScriptError extends Error {
  readonly code = 'QP_SCRIPT_ERROR';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ScriptError';
  }
}

/**
 * Token buckets on one Redis or one Redis Cluster, decided by `lua/token_bucket.lua`. The script is registered
 * with `defineCommand`, so ioredis sends EVALSHA and falls back to EVAL when the server lost its script cache.
 */
export class RedisBucketStore implements BucketStore {
  readonly redis: Redis | Cluster;
  readonly #cluster: boolean;

  constructor(redis: Redis | Cluster) {
    this.redis = redis;
    this.#cluster = redis instanceof Cluster;
    if (typeof (redis as Partial<Redis>).qpTokenBucket !== 'function') {
      redis.defineCommand('qpTokenBucket', { lua: luaSource('token_bucket') });
    }
  }

  /**
   * The slot a key lives in on a cluster; 0 for every key on a single Redis, where any keys may share a script.
   * Callers group layered checks by this value.
   */
  slotOf(key: string): number {
    return this.#cluster ? calculateSlot(key) : 0;
  }

  async decide(request: DecideRequest): Promise<Decision> {
    const encoded = encodeRequest(request);
    const { keys, argv } = scriptArguments(encoded);
    if (this.#cluster) this.#assertOneSlot(keys);
    let reply: unknown;
    try {
      reply = await this.redis.qpTokenBucket(keys.length, ...keys, ...argv);
    } catch (error) {
      if (error instanceof Error && /^(QP_BADARG|CROSSSLOT)/.test(error.message)) {
        throw new ScriptError(error.message, { cause: error });
      }
      throw error;
    }
    return decodeReply(parseReply(reply, encoded.checks.length));
  }

  #assertOneSlot(keys: readonly string[]): void {
    const first = calculateSlot(keys[0]!);
    for (let i = 1; i < keys.length; i++) {
      if (calculateSlot(keys[i]!) !== first) {
        throw new CrossSlotError([...new Set(keys.map((k) => calculateSlot(k)))]);
      }
    }
  }
}
