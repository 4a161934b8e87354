import type { Cluster, Redis, Result } from 'ioredis';
import type { DecideRequest, Decision } from '../../core/bucket-wire.js';
import { encodeRefund, parseRefundReply, refundArguments, type RefundRequest } from '../../core/refund.js';
import { MICRO } from '../../core/token-bucket.js';
import type { ClaimOutcome, DecisionStore, RefundOutcome } from '../decisions/decision-store.js';
import { RedisBucketStore, ScriptError, type RedisBucketStoreOptions } from './bucket-store.js';
import { luaSource } from './scripts.js';

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

  constructor(redis: Redis | Cluster, options: RedisBucketStoreOptions = {}) {
    this.redis = redis;
    this.buckets = new RedisBucketStore(redis, options);
    if (typeof (redis as Partial<Redis>).qpRefund !== 'function') {
      redis.defineCommand('qpRefund', { lua: luaSource('refund') });
    }
  }

  decide(request: DecideRequest): Promise<Decision> {
    return this.buckets.decide(request);
  }

  slotOf(key: string): number {
    return this.buckets.slotOf(key);
  }

  async refund(request: RefundRequest): Promise<RefundOutcome> {
    const encoded = encodeRefund(request);
    const { keys, argv } = refundArguments(encoded);
    let raw: unknown;
    try {
      raw = await this.redis.qpRefund(keys.length, ...keys, ...argv);
    } catch (error) {
      if (error instanceof Error && /^(QP_BADARG|CROSSSLOT)/.test(error.message)) {
        throw new ScriptError(error.message, { cause: error });
      }
      throw error;
    }
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
    const previous = peekOnly
      ? await this.redis.get(key)
      : ((await this.redis.call('SET', key, fingerprint, 'PX', String(ttlMs), 'NX', 'GET')) as string | null);
    if (previous === null) return 'new';
    return previous === fingerprint ? 'same' : 'conflict';
  }
}
