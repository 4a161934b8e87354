/**
 * The CLI's flags, parsed and checked without touching the environment: bad input becomes a SimConfigError
 * (the CLI prints it and exits 2), never a half-run.
 */
import { parseArgs } from 'node:util';
import { DEFAULT_ROUND_TRIPS } from '../core/distance.js';
import { SimConfigError } from './errors.js';
import {
  DEFAULT_COMPRESSION,
  DEFAULT_GEO_COMPRESSION,
  MAX_COMPRESSION,
  REPLAY_MODES,
} from './replay/replay-plan.js';
import { findScenario, scenarios } from './scenarios/catalogue.js';
import type { Scenario } from './scenario.js';
import { describeSettings, isSettingName, REGION_NAMES, type SettingName } from './settings.js';
import type { SimulateOptions } from './simulate.js';
import type { StrategyDefinition } from './strategy.js';
import { findStrategy, strategies } from './strategies/registry.js';

export const DEFAULT_STRATEGIES = ['ideal', 'independent', 'static', 'strict', 'dynamic', 'naive-dynamic'];

/** Settings that every run reads, whatever the scenario and strategies. */
const ALWAYS_USED: readonly SettingName[] = [
  'durationS',
  'capacity',
  'refillPerSecond',
  'maxCost',
  'kind',
  'holdS',
  'warmupS',
  'binS',
  'convergenceTolerance',
  'convergenceWindowS',
  'convergenceHoldS',
];
/** Settings read by any strategy that sends messages. */
const NETWORK_SETTINGS: readonly SettingName[] = [
  'linkDelayMs',
  'linkJitterMs',
  'linkLoss',
  'localDelayMs',
  'links',
];
const NETWORKED = new Set(['strict', 'dynamic', 'naive-dynamic']);

export interface CliOptions extends SimulateOptions {
  outDir: string;
  quiet: boolean;
  /** Notes for stderr (a swept setting no selected strategy reads, …). */
  warnings: string[];
  /** `--real-stack` / `--attach`: replay on the stack beside the prediction (simulations/replay/). */
  realStack?:
    | {
        compression: number;
        attach: string | undefined;
        /** `--geo`: the stack's geo topology, regions this round-trip matrix apart (wall ms, `us-eu=70,…`). */
        geo?: { roundTrips: string } | undefined;
      }
    | undefined;
}

export type ParsedCli = { help: true } | ({ help: false } & CliOptions);

export function usage(): string {
  const list = (items: readonly { name: string; description: string }[]) =>
    items.map((i) => `  ${i.name.padEnd(22)} ${i.description}`);
  return [
    'usage: npm run simulate -- --scenario NAME[,NAME…|all] [--strategies a,b,…] [--regions N] [--seed S]',
    '                           [--out DIR] [--duration S] [--set NAME=VALUE]… [--sweep NAME=v1,v2,…] [--quiet]',
    '       npm run simulate -- --scenario NAME --real-stack [--compress K] [--attach STATE_FILE] [--geo] [--strategies …] …',
    '',
    'Runs each scenario under each strategy on the same arrivals, compares every decision with the ideal oracle,',
    'prints a table and writes DIR/results.json, DIR/admitted.svg, DIR/shares.svg (DIR/tradeoff.svg for a sweep)',
    'and DIR/report.html. Several scenarios write DIR/<scenario>/… and a combined DIR/results.json.',
    '',
    'options:',
    '  --scenario NAME        scenario(s) to run, comma-separated, or all',
    `  --strategies LIST      strategies to compare (default ${DEFAULT_STRATEGIES.join(',')})`,
    `  --regions N            number of regions, 1-${REGION_NAMES.length} (default 3: ${REGION_NAMES.slice(0, 3).join(', ')})`,
    '  --seed S               seed of every random stream, integer ≥ 0 (default 1)',
    '  --out DIR              output folder (default .sim-out/<scenario>)',
    '  --duration S           simulated seconds (same as --set durationS=S)',
    '  --set NAME=VALUE       change a setting (repeatable)',
    '  --sweep NAME=a,b,c     run once per value and chart overshoot against false denials',
    '  --quiet                no progress on stderr',
    '  --real-stack           also replay the arrivals, time-compressed, against a real three-region stack',
    '                         (npm start on free loopback ports) and print its metrics beside the prediction;',
    `                         strategies ${Object.keys(REPLAY_MODES).join(', ')} (default dynamic); see docs/simulations.md`,
    `  --compress K           real stack: K scenario seconds per wall second, integer 1-${MAX_COMPRESSION} (default ${DEFAULT_COMPRESSION},`,
    `                         ${DEFAULT_GEO_COMPRESSION} with --geo)`,
    '  --attach FILE          real stack: use the running stack whose launcher wrote FILE (QP_STACK_STATE_FILE);',
    '                         its admin token in QP_ADMIN_TOKEN; implies --real-stack',
    '  --geo                  real stack: the geo topology (npm start -- --geo), regions a WAN apart; the',
    '                         prediction gets the same round trips (times K) on its links',
    `  --round-trips M        with --geo: the round trips, wall ms (default ${DEFAULT_ROUND_TRIPS})`,
    '  --help                 this text',
    '',
    'scenarios:',
    ...list(scenarios),
    '',
    'strategies:',
    ...list(strategies),
    '',
    'settings (name, default, meaning; scenarios change some defaults, see docs/simulations.md;',
    '"dynamic strategies" are dynamic and naive-dynamic, "dynamic" alone the lease protocol):',
    ...describeSettings(),
    '',
  ].join('\n');
}

function splitList(flag: string, text: string): string[] {
  const items = text.split(',').map((s) => s.trim());
  if (items.some((s) => s === '')) throw new SimConfigError(`${flag}: empty item in "${text}"`);
  if (new Set(items).size !== items.length) throw new SimConfigError(`${flag}: repeated item in "${text}"`);
  return items;
}

function integer(flag: string, text: string, min: number, max: number): number {
  const n = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(n) || n < min || n > max)
    throw new SimConfigError(`${flag} must be an integer in [${min}, ${max}], got "${text}"`);
  return n;
}

function assignment(flag: string, text: string): [SettingName, string] {
  const eq = text.indexOf('=');
  if (eq <= 0) throw new SimConfigError(`${flag} wants NAME=VALUE, got "${text}"`);
  const name = text.slice(0, eq);
  if (!isSettingName(name))
    throw new SimConfigError(`${flag}: unknown setting ${name} (see --help for the list)`);
  return [name, text.slice(eq + 1)];
}

export function parseCli(argv: readonly string[]): ParsedCli {
  let values;
  try {
    ({ values } = parseArgs({
      args: [...argv],
      strict: true,
      allowPositionals: false,
      options: {
        scenario: { type: 'string' },
        strategies: { type: 'string' },
        regions: { type: 'string' },
        seed: { type: 'string' },
        out: { type: 'string' },
        duration: { type: 'string' },
        set: { type: 'string', multiple: true },
        sweep: { type: 'string' },
        quiet: { type: 'boolean' },
        'real-stack': { type: 'boolean' },
        compress: { type: 'string' },
        attach: { type: 'string' },
        geo: { type: 'boolean' },
        'round-trips': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (error) {
    throw new SimConfigError((error as Error).message);
  }
  if (values.help === true) return { help: true };
  if (values.scenario === undefined)
    throw new SimConfigError('--scenario is required (see --help for the list)');

  const chosenScenarios: Scenario[] =
    values.scenario === 'all'
      ? [...scenarios]
      : splitList('--scenario', values.scenario).map((name) => {
          const s = findScenario(name);
          if (s === undefined)
            throw new SimConfigError(
              `unknown scenario ${name}; known: ${scenarios.map((x) => x.name).join(', ')}, all`,
            );
          return s;
        });

  const real = values['real-stack'] === true || values.attach !== undefined;
  if (!real && values.compress !== undefined)
    throw new SimConfigError('--compress applies to --real-stack only');
  if (values.attach !== undefined && values.attach.trim() === '')
    throw new SimConfigError('--attach needs the path of a stack state file');
  if (!real && values.geo === true) throw new SimConfigError('--geo applies to --real-stack only');
  if (values.geo !== true && values['round-trips'] !== undefined)
    throw new SimConfigError('--round-trips applies to --geo only');
  const realStack = real
    ? {
        compression: integer(
          '--compress',
          values.compress ?? String(values.geo === true ? DEFAULT_GEO_COMPRESSION : DEFAULT_COMPRESSION),
          1,
          MAX_COMPRESSION,
        ),
        attach: values.attach,
        geo: values.geo === true ? { roundTrips: values['round-trips'] ?? DEFAULT_ROUND_TRIPS } : undefined,
      }
    : undefined;

  const chosenStrategies: StrategyDefinition[] = splitList(
    '--strategies',
    values.strategies ?? (real ? 'dynamic' : DEFAULT_STRATEGIES.join(',')),
  ).map((name) => {
    const s = findStrategy(name);
    if (s !== undefined) return s;
    throw new SimConfigError(`unknown strategy ${name}; known: ${strategies.map((x) => x.name).join(', ')}`);
  });

  const regionCount = integer('--regions', values.regions ?? '3', 1, REGION_NAMES.length);
  const seed = integer('--seed', values.seed ?? '1', 0, Number.MAX_SAFE_INTEGER);

  const overrides: Record<string, string> = {};
  for (const text of values.set ?? []) {
    const [name, value] = assignment('--set', text);
    if (name in overrides) throw new SimConfigError(`--set ${name} given twice`);
    overrides[name] = value;
  }
  if (values.duration !== undefined) {
    if ('durationS' in overrides) throw new SimConfigError('--duration and --set durationS both given');
    overrides['durationS'] = values.duration;
  }

  const warnings: string[] = [];
  let sweep: CliOptions['sweep'];
  if (values.sweep !== undefined) {
    const [setting, list] = assignment('--sweep', values.sweep);
    if (setting in overrides) throw new SimConfigError(`--sweep ${setting} conflicts with --set ${setting}`);
    sweep = { setting, values: splitList('--sweep', list) };
    const used = new Set<SettingName>([
      ...ALWAYS_USED,
      ...chosenScenarios.flatMap((s) => s.uses),
      ...chosenStrategies.flatMap((s) => s.uses),
      ...(chosenStrategies.some((s) => NETWORKED.has(s.name)) ? NETWORK_SETTINGS : []),
    ]);
    if (!used.has(setting))
      warnings.push(
        `note: ${setting} is read by none of the chosen scenarios or strategies; every swept run will be the same`,
      );
  }

  const outDir =
    values.out ??
    `.sim-out/${values.scenario === 'all' ? 'all' : chosenScenarios.map((s) => s.name).join('+')}${real ? '-real-stack' : ''}`;
  if (outDir.trim() === '') throw new SimConfigError('--out must not be empty');
  return {
    help: false,
    scenarios: chosenScenarios,
    strategies: chosenStrategies,
    regionCount,
    seed,
    overrides,
    sweep,
    outDir,
    quiet: values.quiet === true,
    warnings,
    realStack,
  };
}
