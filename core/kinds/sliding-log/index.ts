/**
 * The `sliding_log` kind as registered (core/kinds/index.ts): its traits, its schema fragment, its model
 * (core/models/sliding-log.ts, the model of lua/sliding_log.lua and lua/sliding_log_refund.lua) and its share
 * sizing (`sizedLog`, beside the model).
 */
import { SlidingLogModel, sizedLog } from '../../models/sliding-log.js';
import type { Kind } from '../kind.js';
import { slidingLogSchema } from './schema.js';
import { slidingLogTraits } from './traits.js';

export { MAX_WINDOW_SECONDS } from './schema.js';
export { SlidingLogModel, sizedLog };

export const slidingLogKind = {
  ...slidingLogTraits,
  schema: slidingLogSchema,
  model: SlidingLogModel,
  sizing: sizedLog,
} as const satisfies Kind<'sliding_log'>;
