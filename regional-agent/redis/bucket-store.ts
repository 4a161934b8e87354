import calculateSlot from 'cluster-key-slot';
import { Cluster, type Redis, type Result } from 'ioredis';
import type { BucketStore } from '../../core/bucket-store.js';
import {
  MAX_REQUESTS_PER_CALL,
  decodeReply,
  encodeRequest,
  parseReplies,
  scriptCall,
  type DecideRequest,
  type Decision,
} from '../../core/bucket-wire.js';
import type { EncodedReply, EncodedRequest } from '../../core/token-bucket.js';
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

/** The Redis refused the script (as opposed to denying a request). */
export class ScriptError extends Error {
  readonly code = 'QP_SCRIPT_ERROR';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ScriptError';
  }
}

export interface RedisBucketStoreOptions {
  /**
   * Coalesce the requests that arrive in one event-loop turn (per cluster slot) into one script call, up to
   * `maxBatch` requests. Each request is still decided all-or-nothing on its own, in arrival order; the batch
   * only saves round trips and per-call script overhead. Default true.
   */
  batch?: boolean;
  /** Most requests per script call, 1..256. Default 64. */
  maxBatch?: number;
}

interface Waiting {
  request: EncodedRequest;
  resolve: (reply: EncodedReply) => void;
  reject: (error: unknown) => void;
}

/**
 * Token buckets on one Redis or one Redis Cluster, decided by `lua/token_bucket.lua`. The script is registered
 * with `defineCommand`, so ioredis sends EVALSHA and falls back to EVAL when the server lost its script cache.
 */
export class RedisBucketStore implements BucketStore {
  readonly redis: Redis | Cluster;
  readonly #cluster: boolean;
  readonly #batch: boolean;
  readonly #maxBatch: number;
  /** Requests waiting for the next flush, by cluster slot (0 on a single Redis). */
  #waiting = new Map<number, Waiting[]>();
  #flushScheduled = false;

  constructor(redis: Redis | Cluster, options: RedisBucketStoreOptions = {}) {
    this.redis = redis;
    this.#cluster = redis instanceof Cluster;
    this.#batch = options.batch ?? true;
    this.#maxBatch = options.maxBatch ?? 64;
    if (!(
      Number.isInteger(this.#maxBatch) &&
      this.#maxBatch >= 1 &&
      this.#maxBatch <= MAX_REQUESTS_PER_CALL
    )) {
      throw new RangeError(`maxBatch must be an integer in [1, ${MAX_REQUESTS_PER_CALL}]`);
    }
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
    const slot = this.#cluster ? this.#oneSlot(encoded) : 0;
    if (!this.#batch) return decodeReply((await this.#call([encoded]))[0]!);
    const reply = await new Promise<EncodedReply>((resolve, reject) => {
      let queue = this.#waiting.get(slot);
      if (queue === undefined) this.#waiting.set(slot, (queue = []));
      queue.push({ request: encoded, resolve, reject });
      if (!this.#flushScheduled) {
        this.#flushScheduled = true;
        setImmediate(this.#flush);
      }
    });
    return decodeReply(reply);
  }

  readonly #flush = (): void => {
    this.#flushScheduled = false;
    const waiting = this.#waiting;
    this.#waiting = new Map();
    for (const queue of waiting.values()) {
      for (let at = 0; at < queue.length; at += this.#maxBatch) {
        const chunk = queue.slice(at, at + this.#maxBatch);
        this.#call(chunk.map((w) => w.request)).then(
          (replies) => chunk.forEach((w, i) => w.resolve(replies[i]!)),
          (error: unknown) => chunk.forEach((w) => w.reject(error)),
        );
      }
    }
  };

  async #call(requests: readonly EncodedRequest[]): Promise<EncodedReply[]> {
    const { keys, argv } = scriptCall(requests);
    let reply: unknown;
    try {
      reply = await this.redis.qpTokenBucket(keys.length, ...keys, ...argv);
    } catch (error) {
      if (error instanceof Error && /^(QP_BADARG|CROSSSLOT)/.test(error.message)) {
        throw new ScriptError(error.message, { cause: error });
      }
      throw error;
    }
    return parseReplies(
      reply,
      requests.map((r) => r.checks.length),
    );
  }

  #oneSlot(request: EncodedRequest): number {
    const keys =
      request.idempotency === undefined ? request.keys : [...request.keys, request.idempotency.key];
    const first = calculateSlot(keys[0]!);
    for (let i = 1; i < keys.length; i++) {
      if (calculateSlot(keys[i]!) !== first)
        throw new CrossSlotError([...new Set(keys.map((k) => calculateSlot(k)))]);
    }
    return first;
  }
}
