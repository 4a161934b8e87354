/**
 * One run: a scenario's arrivals, offered to one strategy and, in the same instant, to the ideal oracle, under a
 * virtual clock, with the scenario's faults injected; returns the metrics and the series for the charts.
 */
import { ZodError } from 'zod';
import { kindOf } from '../../core/kinds/index.js';
import { isLogKind, parsePolicy, type Policy } from '../../core/policy/policy.js';
import { SimConfigError } from '../errors.js';
import { logWindowOf, REGION_NAMES, type Settings } from '../settings.js';
import type { StrategyDefinition } from '../strategy.js';
import { buildLinks } from './links.js';
import { SimulationRun, type RunOutput, type RunSpec } from './simulation-run.js';
import { enterpriseClassFields } from './subject-classes.js';

export type { RunOutput, RunSpec } from './simulation-run.js';
export { WORST_SUBJECT_MIN_REQUESTS } from './simulation-run.js';

/** The regions of a run. */
export function regionsOf(count: number): string[] {
  if (!(Number.isInteger(count) && count >= 1 && count <= REGION_NAMES.length))
    throw new SimConfigError(`--regions must be an integer in [1, ${REGION_NAMES.length}]`);
  return REGION_NAMES.slice(0, count);
}

/** The policy a strategy enforces in a run, parsed by core/policy/policy.ts. */
export function simPolicy(
  settings: Settings,
  strategy: StrategyDefinition,
  regions: readonly string[],
): Policy {
  const homeRegion = settings.homeRegion ?? regions[0]!;
  if (!regions.includes(homeRegion))
    throw new SimConfigError(
      `homeRegion ${homeRegion} is not one of this run's regions (${regions.join(', ')})`,
    );
  const window = logWindowOf(settings);
  const windowField = settings.kind === undefined ? undefined : kindOf(settings.kind).window;
  const parsed = parsePolicySafely(
    {
      name: 'sim',
      capacity: settings.capacity,
      // A log kind keeps C over a window of C / R seconds; its rate is derived from them (core/policy/policy.ts).
      ...(settings.kind !== undefined && windowField !== undefined
        ? { kind: settings.kind, [windowField]: window }
        : { refillPerSecond: settings.refillPerSecond }),
      maxCost: settings.maxCost,
      mode: strategy.mode,
      homeRegion,
      onStoreFailure: settings.onStoreFailure,
      // The floor of moving shares is the policy's own setting; strategies that never move shares leave it unset.
      ...(strategy.uses.includes('minShare') ? { minShare: settings.minShare } : {}),
      // Subject classes: the enterprise subjects' capacity and refill (engine/subject-classes.ts).
      ...enterpriseClassFields(settings),
    },
    strategy,
    settings,
  );
  return parsed;
}

function parsePolicySafely(
  input: Parameters<typeof parsePolicy>[0],
  strategy: StrategyDefinition,
  settings: Settings,
): Policy {
  try {
    return parsePolicy(input);
  } catch (error) {
    if (!(error instanceof ZodError)) throw error;
    // As simulate.ts words invalid settings: `path: message`, each followed by the setting that decides it.
    const problems = error.issues.map((i) => {
      const hint = settingToChange(i.path[0], settings);
      return `${i.path.join('.') || 'policy'}: ${i.message}${hint === undefined ? '' : `; change ${hint}`}`;
    });
    throw new SimConfigError(`the policy ${strategy.name} enforces is invalid: ${problems.join('; ')}`);
  }
}

/** The `--set` that decides a field of the simulated policy (simPolicy above builds it from the settings). */
function settingToChange(field: PropertyKey | undefined, s: Settings): string | undefined {
  switch (field) {
    case 'minShare': {
      // The smallest capacity a share applies to: the policy's, or its enterprise class's when that is smaller.
      const factor = (s.enterpriseSubjects ?? 0) > 0 ? Math.min(1, s.enterpriseFactor ?? 1) : 1;
      const least = Math.ceil((s.maxCost / (s.capacity * factor)) * 1e6) / 1e6;
      return factor === 1
        ? `--set minShare=… (≥ maxCost / capacity = ${least})`
        : `--set minShare=… (≥ maxCost / (capacity × enterpriseFactor) = ${least})`;
    }
    case 'capacity':
    case 'refillPerSecond':
    case 'maxCost':
    case 'homeRegion':
    case 'onStoreFailure':
      return `--set ${field}=…`;
    case 'windowSeconds':
    case 'leaseSeconds':
      return '--set capacity=… or --set refillPerSecond=… (the window is capacity / refillPerSecond)';
    case 'classes':
    case 'subjects':
      return '--set enterpriseFactor=… or --set enterpriseSubjects=…';
    default:
      return undefined;
  }
}

/** Check what can be checked before running: regions, the policy, fault times, links. Throws SimConfigError. */
export function validateRun(spec: RunSpec): { regions: string[]; policy: Policy } {
  const { scenario, strategy, settings } = spec;
  const regions = regionsOf(spec.regionCount);
  const policy = simPolicy(settings, strategy, regions);
  for (const key of ['shiftAtS', 'faultAtS', 'idleAtS'] as const) {
    if (scenario.uses.includes(key) && settings[key] >= settings.durationS)
      throw new SimConfigError(
        `${scenario.name}: ${key} (${settings[key]}) must be before the end of the run (durationS ${settings.durationS})`,
      );
  }
  // cold-start: demand must come back within the run, or there is no resume to measure.
  if (scenario.uses.includes('idleForS') && settings.idleAtS + settings.idleForS >= settings.durationS)
    throw new SimConfigError(
      `${scenario.name}: idleAtS + idleForS (${settings.idleAtS + settings.idleForS}) must be before the end of the run (durationS ${settings.durationS})`,
    );
  if (isLogKind(policy.kind) && scenario.uses.includes('failoverReset'))
    throw new SimConfigError(
      `${scenario.name}: a failover of the simulated Redis copies token buckets only; run it with kind token_bucket`,
    );
  if (settings.warmupS >= settings.durationS) {
    throw new SimConfigError(
      `warmupS (${settings.warmupS}) must be before the end of the run (durationS ${settings.durationS}): nothing would be measured`,
    );
  }
  buildLinks(
    regions,
    regions.map((_, i) => i),
    settings,
  );
  strategy.validate?.(settings, regions, policy);
  return { regions, policy };
}

/**
 * One run, step by step: check the spec, set the run up, start the strategy, schedule the arrivals, the faults
 * and the sampling, run the clock to the end, and summarise. Each step is a method of SimulationRun below.
 */
export function runSimulation(spec: RunSpec): RunOutput {
  const run = new SimulationRun(spec, validateRun(spec));
  // The order matters: events at the same instant fire in the order they were scheduled (engine/event-queue.ts).
  run.startStrategy();
  run.scheduleArrivals();
  run.scheduleFaults();
  run.scheduleSampling();
  run.runToEnd();
  return run.summarise();
}
