import { DEFAULT_STORE_TIMEOUT_MS } from '../config.js';
import type { Cluster, Redis } from 'ioredis';
import { agentMicros, type RedisClock } from './redis-clock.js';
import { defineScript, runScript } from './scripts.js';

/** How one kind's decide script and refund script are called: their wire format (core/). */
export interface ScriptPair<
  Req extends { checks: unknown[] },
  Reply,
  Refund extends { entries: unknown[] },
  Back,
> {
  /** `lua/<decide>.lua` and `lua/<refund>.lua`. */
  decide: string;
  refund: string;
  /** Names for errors and timeouts ("sliding-log script"). */
  what: string;
  parse(request: Req): Req;
  decideArguments(request: Req, deadline: number): { keys: string[]; argv: string[] };
  parseReply(raw: unknown, checks: number): Reply;
  refundArguments(refund: Refund): { keys: string[]; argv: string[] };
  parseRefundReply(raw: unknown, checks: number): Back;
}

/**
 * A kind decided by one script call per request and refunded by another (sliding logs, daily budgets), on one
 * Redis or one Redis Cluster: a call is not batched with others, its keys share a slot (the decision path's
 * grouping guarantees it), and it carries its deadline into the script when a clock is given.
 */
export class RedisScriptPairStore<
  Req extends { checks: unknown[] },
  Reply,
  Refund extends { entries: unknown[] },
  Back,
> {
  readonly redis: Redis | Cluster;
  readonly #pair: ScriptPair<Req, Reply, Refund, Back>;
  readonly #timeoutMs: number;
  readonly #clock: RedisClock | undefined;
  readonly #decideCommand: string;
  readonly #refundCommand: string;

  constructor(
    redis: Redis | Cluster,
    pair: ScriptPair<Req, Reply, Refund, Back>,
    options: { timeoutMs?: number; clock?: RedisClock | undefined } = {},
  ) {
    this.redis = redis;
    this.#pair = pair;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
    this.#clock = options.clock;
    this.#decideCommand = defineScript(redis, pair.decide);
    this.#refundCommand = defineScript(redis, pair.refund);
  }

  async decide(request: Req): Promise<Reply> {
    const parsed = this.#pair.parse(request);
    const deadline = this.#clock?.toRedisMicros(agentMicros() + this.#timeoutMs * 1000) ?? 0;
    const { keys, argv } = this.#pair.decideArguments(parsed, Math.round(deadline));
    const raw = await this.#run(this.#decideCommand, keys, argv, this.#pair.what);
    return this.#pair.parseReply(raw, parsed.checks.length);
  }

  async refund(refund: Refund): Promise<Back> {
    const { keys, argv } = this.#pair.refundArguments(refund);
    const raw = await this.#run(this.#refundCommand, keys, argv, `${this.#pair.what} refund`);
    return this.#pair.parseRefundReply(raw, refund.entries.length);
  }

  #run(command: string, keys: string[], argv: string[], what: string): Promise<unknown> {
    return runScript(this.redis, command, keys, argv, this.#timeoutMs, what);
  }
}
