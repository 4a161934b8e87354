import type { Cluster, Redis, Result } from 'ioredis';
import {
  creditArguments,
  lendArguments,
  parseCreditReply,
  parseLendReply,
  type EncodedCredit,
  type EncodedCreditResult,
  type EncodedLend,
  type EncodedLendResult,
} from '../../core/models/transfer.js';
import type { TransferStore } from '../borrowing/transfer-store.js';
import { defineScript, runScript } from './scripts.js';
import { agentMicros, type RedisClock } from './redis-clock.js';
import { DEFAULT_STORE_TIMEOUT_MS } from '../config.js';

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** `lua/lend.lua`: number of keys, keys, ARGV. */
    qpLend(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
    /** `lua/credit.lua`: number of keys, keys, ARGV. */
    qpCredit(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
  }
}

export interface RedisTransferStoreOptions {
  /** A call whose reply has not arrived this long after its write fails (WireTimeoutError). Default DEFAULT_STORE_TIMEOUT_MS. */
  timeoutMs?: number;
  /** Converts a lend's deadline to Redis time; without one, lends carry no deadline into the script. */
  clock?: RedisClock | undefined;
}

/** Lends and credits on one Redis or Redis Cluster (one key per call: always one slot). */
export class RedisTransferStore implements TransferStore {
  readonly #redis: Redis | Cluster;
  readonly #timeoutMs: number;
  readonly #clock: RedisClock | undefined;

  constructor(redis: Redis | Cluster, options: RedisTransferStoreOptions = {}) {
    this.#redis = redis;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
    this.#clock = options.clock;
    defineScript(redis, 'lend');
    defineScript(redis, 'credit');
  }

  async lend(lend: EncodedLend, deadlineAtMs: number): Promise<EncodedLendResult> {
    const leftUs = Math.max(0, Math.floor((deadlineAtMs - Date.now()) * 1000));
    const deadline = this.#clock?.toRedisMicros(agentMicros() + leftUs) ?? 0;
    const { keys, argv } = lendArguments(lend, deadline);
    const timeout = Math.max(1, Math.min(this.#timeoutMs, Math.ceil(leftUs / 1000)));
    return parseLendReply(await runScript(this.#redis, 'qpLend', keys, argv, timeout, 'transfer script'));
  }

  async credit(credit: EncodedCredit): Promise<EncodedCreditResult> {
    const { keys, argv } = creditArguments(credit);
    return parseCreditReply(
      await runScript(this.#redis, 'qpCredit', keys, argv, this.#timeoutMs, 'transfer script'),
    );
  }
}
