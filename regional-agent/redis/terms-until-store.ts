import type { Cluster, Redis, Result } from 'ioredis';
import { termsUntilKey } from '../../core/keys.js';
import type { TermsUntilRecord, TermsUntilStore } from '../terms/terms-until.js';
import { whenReady } from './connect.js';
import { defineScript, runScript } from './scripts.js';

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** `lua/terms_until.lua`: number of keys, keys, ARGV. */
    qpTermsUntil(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
  }
}

/** How long the key outlives the instant it records, ms: it says nothing after that instant, only kept to be seen. */
export const TERMS_UNTIL_EXPIRY_SLACK_MS = 10_000;

export interface RedisTermsUntilOptions {
  /** This agent's instance name (coordination.ts `agentInstance`). */
  instance: string;
  /** A write or read whose reply has not arrived this long after it was sent fails, ms. */
  timeoutMs: number;
  /** A read waits this long for the client to connect (at start, Redis usually is not yet), ms. Default 2000. */
  readyWithinMs?: number;
}

/** The instance's record of its terms (regional-agent/terms/terms-until.ts) on one Redis or Redis Cluster. */
export class RedisTermsUntil implements TermsUntilStore {
  readonly #redis: Redis | Cluster;
  readonly #key: string;
  readonly #timeoutMs: number;
  readonly #readyWithinMs: number;

  constructor(redis: Redis | Cluster, options: RedisTermsUntilOptions) {
    this.#redis = redis;
    this.#key = termsUntilKey(options.instance);
    this.#timeoutMs = options.timeoutMs;
    this.#readyWithinMs = options.readyWithinMs ?? 2000;
    defineScript(redis, 'terms_until');
  }

  get key(): string {
    return this.#key;
  }

  async write(untilMicros: number): Promise<void> {
    const expireAt = Math.ceil(untilMicros / 1000) + TERMS_UNTIL_EXPIRY_SLACK_MS;
    await this.#call(String(Math.ceil(untilMicros)), String(expireAt));
  }

  async read(): Promise<TermsUntilRecord> {
    if (!(await whenReady(this.#redis, this.#readyWithinMs)))
      throw new Error(`Redis not ready within ${this.#readyWithinMs} ms`);
    return this.#call('0', '0');
  }

  async #call(until: string, expireAt: string): Promise<TermsUntilRecord> {
    const reply = await runScript(
      this.#redis,
      'qpTermsUntil',
      [this.#key],
      [until, expireAt],
      this.#timeoutMs,
      'terms-until script',
    );
    if (!Array.isArray(reply) || reply.length !== 2) throw new Error('terms-until script: unexpected reply');
    const [untilMicros, nowMicros] = reply.map(Number) as [number, number];
    if (!Number.isFinite(untilMicros) || !Number.isFinite(nowMicros))
      throw new Error('terms-until script: unexpected reply');
    return { untilMicros, nowMicros };
  }
}
