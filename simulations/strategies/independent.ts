import type { StrategyDefinition } from '../strategy.js';
import { FixedShareStrategy } from './local-buckets.js';

/** Every region enforces the whole budget alone (policy mode `local`): up to N× the budget, by design. */
export const independent: StrategyDefinition = {
  name: 'independent',
  description: 'every region enforces the full budget alone (mode local): up to N× overshoot',
  mode: 'local',
  uses: [],
  create: () => new FixedShareStrategy(() => 1),
};
