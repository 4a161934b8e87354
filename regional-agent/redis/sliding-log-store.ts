import type { Cluster, Redis } from 'ioredis';
import {
  logArguments,
  logRefundArguments,
  parseLogRefundReply,
  parseLogReply,
  parseLogRequest,
  type LogRefund,
  type LogReply,
  type LogRequest,
} from '../../core/models/sliding-log.js';
import type { RedisClock } from './redis-clock.js';
import { RedisScriptPairStore } from './script-pair-store.js';

/** Sliding logs on one Redis or one Redis Cluster: `lua/sliding_log.lua`, refunds by `lua/sliding_log_refund.lua`. */
export class RedisSlidingLogStore extends RedisScriptPairStore<
  LogRequest,
  LogReply,
  LogRefund,
  { removed: number[]; recordDeleted: boolean }
> {
  constructor(redis: Redis | Cluster, options: { timeoutMs?: number; clock?: RedisClock | undefined } = {}) {
    super(
      redis,
      {
        decide: 'sliding_log',
        refund: 'sliding_log_refund',
        what: 'sliding-log script',
        parse: parseLogRequest,
        decideArguments: logArguments,
        parseReply: parseLogReply,
        refundArguments: logRefundArguments,
        parseRefundReply: parseLogRefundReply,
      },
      options,
    );
  }
}
