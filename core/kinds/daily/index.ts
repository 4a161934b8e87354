/**
 * The `daily` kind as registered (core/kinds/index.ts): its traits, its schema fragment, its model
 * (core/models/daily-budget.ts, the model of lua/daily_budget.lua and lua/daily_budget_refund.lua) and its share
 * sizing (`sizedDay`, beside the model).
 */
import { DailyBudgetModel, sizedDay } from '../../models/daily-budget.js';
import type { Kind } from '../kind.js';
import { dailySchema } from './schema.js';
import { dailyTraits } from './traits.js';

export { isTimeZone } from './schema.js';
export { LONGEST_DAY_SECONDS } from './traits.js';
export { DailyBudgetModel, sizedDay };

export const dailyKind = {
  ...dailyTraits,
  schema: dailySchema,
  model: DailyBudgetModel,
  sizing: sizedDay,
} as const satisfies Kind<'daily'>;
