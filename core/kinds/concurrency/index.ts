/**
 * The `concurrency` kind as registered (core/kinds/index.ts): its traits, its schema fragment, and the sliding
 * log's model and share sizing (core/models/sliding-log.ts), whose window is its lease. Its lease tokens are
 * core/concurrency.ts.
 */
import { SlidingLogModel, sizedLog } from '../../models/sliding-log.js';
import type { Kind } from '../kind.js';
import { concurrencySchema } from './schema.js';
import { concurrencyTraits } from './traits.js';

export { MAX_LEASE_SECONDS } from './schema.js';
export { SlidingLogModel, sizedLog };

export const concurrencyKind = {
  ...concurrencyTraits,
  schema: concurrencySchema,
  model: SlidingLogModel,
  sizing: sizedLog,
} as const satisfies Kind<'concurrency'>;
