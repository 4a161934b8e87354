import type { StrategyDefinition } from '../strategy.js';
import { FixedShareStrategy } from './local-buckets.js';

/**
 * A fixed, even split: each region enforces overcommit/N of C and R. With overcommit 1 the shares sum to 1 and
 * no window can exceed the budget; above 1 it trades overshoot for fewer false denials (sweep it).
 */
export const staticSplit: StrategyDefinition = {
  name: 'static',
  description: 'fixed even split: each region enforces overcommit/N of C and R',
  mode: 'regional',
  uses: ['overcommit'],
  create: () => new FixedShareStrategy((ctx) => ctx.settings.overcommit / ctx.regions.length),
};
