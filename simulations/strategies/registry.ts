import type { StrategyDefinition } from '../strategy.js';
import { ideal } from './ideal.js';
import { independent } from './independent.js';
import { staticSplit } from './static-split.js';
import { strict } from './strict.js';

/** Every strategy the CLI can run, in the order `--help` lists them. `dynamic` and `naive-dynamic` join here. */
export const strategies: readonly StrategyDefinition[] = [ideal, independent, staticSplit, strict];

/** Strategies DESIGN.md names that this build cannot run yet, with the reason `--strategies` gives. */
export const PLANNED_STRATEGIES: Readonly<Record<string, string>> = {
  dynamic: 'needs the rebalancer and lease state machines (core/rebalance, core/lease), not built yet',
  'naive-dynamic':
    'needs the rebalancer and lease state machines (core/rebalance, core/lease), not built yet',
};

export function findStrategy(name: string): StrategyDefinition | undefined {
  return strategies.find((s) => s.name === name);
}
