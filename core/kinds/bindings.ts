/**
 * The code behind each kind's named model and sizing function (core/kinds/kind.ts `model`, `sizing`): typed over
 * every kind, so a new kind must bind both. Kept apart from the traits because the models import core/policy/policy.ts,
 * which reads the traits.
 */
import { DailyBudgetModel, sizedDay } from '../models/daily-budget.js';
import { sizedBucket } from '../shares/share-sizing.js';
import { SlidingLogModel, sizedLog } from '../models/sliding-log.js';
import { BucketModel } from '../models/token-bucket.js';
import type { KindName } from './kind.js';

export const KIND_BINDINGS = {
  token_bucket: { model: BucketModel, sizing: sizedBucket },
  sliding_log: { model: SlidingLogModel, sizing: sizedLog },
  concurrency: { model: SlidingLogModel, sizing: sizedLog },
  daily: { model: DailyBudgetModel, sizing: sizedDay },
} as const satisfies {
  readonly [K in KindName]: {
    model: abstract new (...args: never[]) => unknown;
    sizing: (...args: never[]) => unknown;
  };
};
