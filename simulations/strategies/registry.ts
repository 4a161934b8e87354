import type { StrategyDefinition } from '../strategy.js';
import { dynamic } from './dynamic.js';
import { ideal } from './ideal.js';
import { independent } from './independent.js';
import { naiveDynamic } from './naive-dynamic.js';
import { staticSplit } from './static-split.js';
import { strict } from './strict.js';

/** Every strategy the CLI can run, in the order `--help` lists them. */
export const strategies: readonly StrategyDefinition[] = [
  ideal,
  independent,
  staticSplit,
  strict,
  dynamic,
  naiveDynamic,
];

export function findStrategy(name: string): StrategyDefinition | undefined {
  return strategies.find((s) => s.name === name);
}
