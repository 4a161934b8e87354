import type { Cluster, Redis } from 'ioredis';
import {
  dayArguments,
  dayRefundArguments,
  parseDayRefundReply,
  parseDayReply,
  parseDayRequest,
  type DayRefund,
  type DayReply,
  type DayRequest,
} from '../../core/models/daily-budget.js';
import type { RedisClock } from './redis-clock.js';
import { RedisScriptPairStore } from './script-pair-store.js';

/** Daily budgets on one Redis or one Redis Cluster: `lua/daily_budget.lua`, refunds by `lua/daily_budget_refund.lua`. */
export class RedisDailyStore extends RedisScriptPairStore<
  DayRequest,
  DayReply,
  DayRefund,
  { refunded: number[]; recordDeleted: boolean }
> {
  constructor(redis: Redis | Cluster, options: { timeoutMs?: number; clock?: RedisClock | undefined } = {}) {
    super(
      redis,
      {
        decide: 'daily_budget',
        refund: 'daily_budget_refund',
        what: 'daily-budget script',
        parse: parseDayRequest,
        decideArguments: dayArguments,
        parseReply: parseDayReply,
        refundArguments: dayRefundArguments,
        parseRefundReply: parseDayRefundReply,
      },
      options,
    );
  }
}
