/**
 * Runs a set of scenarios × swept values × strategies and writes what the CLI promises: results.json, SVG charts
 * and a self-contained HTML report. Every run is planned (settings validated) before the first one starts.
 */
import { join } from 'node:path';
import { ZodError } from 'zod';
import { runSimulation, validateRun, type RunSpec } from './engine/run.js';
import { SimConfigError } from './errors.js';
import type { RunSeries } from './metrics/recorder.js';
import type { StrategyResult } from './metrics/result.js';
import { deliveryChart, runChartFiles, tradeoffChart } from './report/charts.js';
import { outputFiles } from './report/files.js';
import { htmlReport } from './report/html.js';
import { resultsTable } from './report/table.js';
import { svgDocument } from './report/svg.js';
import type { Scenario } from './scenario.js';
import { DEFAULT_SETTINGS, resolveSettings, type SettingName } from './settings.js';
import type { StrategyDefinition } from './strategy.js';

export interface SimulateOptions {
  scenarios: readonly Scenario[];
  strategies: readonly StrategyDefinition[];
  regionCount: number;
  seed: number;
  /** `--set` overrides, raw. */
  overrides: Readonly<Record<string, string>>;
  sweep?: { setting: SettingName; values: readonly string[] } | undefined;
}

/** What one scenario produced. */
export interface ScenarioOutcome {
  scenario: Scenario;
  results: StrategyResult[];
  /** Series of each strategy (not kept for sweeps, which chart the trade-off only). */
  series: RunSeries[];
}

function formatIssues(error: ZodError): string {
  return error.issues.map((i) => `${i.path.join('.') || 'settings'}: ${i.message}`).join('; ');
}

/**
 * Every run, validated, in the order they will execute. Throws SimConfigError for any bad setting. A strategy
 * that cannot enforce a scenario's policy kind (strict and concurrency) is left out of that scenario, with a note
 * in `skipped`; a scenario left with no strategy at all is an error.
 */
export function planRuns(o: SimulateOptions, skipped: string[] = []): RunSpec[] {
  const specs: RunSpec[] = [];
  for (const scenario of o.scenarios) {
    const planned = specs.length;
    const reasons: string[] = [];
    const values: (string | undefined)[] = o.sweep === undefined ? [undefined] : [...o.sweep.values];
    for (const value of values) {
      let settings;
      try {
        settings = resolveSettings(
          DEFAULT_SETTINGS,
          scenario.defaults,
          o.overrides,
          o.sweep === undefined || value === undefined ? {} : { [o.sweep.setting]: value },
        );
      } catch (error) {
        if (error instanceof ZodError) {
          const where = value === undefined ? '' : ` (${o.sweep!.setting}=${value})`;
          throw new SimConfigError(`invalid settings for ${scenario.name}${where}: ${formatIssues(error)}`);
        }
        throw error;
      }
      for (const strategy of o.strategies) {
        const refusal = strategy.cannotEnforce?.(settings);
        if (refusal !== undefined) {
          const note = `note: ${scenario.name} runs without ${strategy.name}: ${refusal}`;
          if (!reasons.includes(note)) reasons.push(note);
          continue;
        }
        const spec: RunSpec = {
          scenario,
          strategy,
          regionCount: o.regionCount,
          seed: o.seed,
          settings,
          sweep:
            o.sweep === undefined
              ? undefined
              : { setting: o.sweep.setting, value: settings[o.sweep.setting] ?? '' },
        };
        validateRun(spec);
        specs.push(spec);
      }
    }
    if (specs.length === planned && reasons.length > 0)
      throw new SimConfigError(reasons.map((r) => r.replace(/^note: /, '')).join('; '));
    skipped.push(...reasons);
  }
  return specs;
}

/** Run every planned run; `progress(done, total, fraction, label)` follows along. */
export function simulate(
  o: SimulateOptions,
  progress: (done: number, total: number, fraction: number, label: string) => void = () => undefined,
): ScenarioOutcome[] {
  const specs = planRuns(o);
  const outcomes = new Map<Scenario, ScenarioOutcome>();
  specs.forEach((spec, done) => {
    const label = `${spec.scenario.name}/${spec.strategy.name}${spec.sweep ? ` ${spec.sweep.setting}=${String(spec.sweep.value)}` : ''}`;
    const run = runSimulation({
      ...spec,
      onProgress: (fraction) => progress(done, specs.length, fraction, label),
    });
    let outcome = outcomes.get(spec.scenario);
    if (outcome === undefined) {
      outcome = { scenario: spec.scenario, results: [], series: [] };
      outcomes.set(spec.scenario, outcome);
    }
    outcome.results.push(run.result);
    if (o.sweep === undefined) outcome.series.push(run.series);
  });
  return [...outcomes.values()];
}

/** JSON with two-space indentation and a final newline: byte-identical for identical results. */
export function resultsJson(results: readonly StrategyResult[]): string {
  return JSON.stringify(results, null, 2) + '\n';
}

/** Write one scenario's files into `dir`; returns the paths written. */
export function writeScenario(dir: string, outcome: ScenarioOutcome): string[] {
  const { put, written } = outputFiles(dir);
  const { results, series } = outcome;
  put('results.json', resultsJson(results));
  const svgs: string[] = [];
  const swept = results.some((r) => r.sweep !== undefined);
  if (swept) {
    const tradeoff = svgDocument(tradeoffChart(results));
    put('tradeoff.svg', tradeoff);
    svgs.push(tradeoff);
  } else {
    for (const { name, svg } of runChartFiles(results.map((result, i) => ({ result, series: series[i]! })))) {
      put(name, svg);
      svgs.push(svg);
    }
  }
  const delivery = svgDocument(deliveryChart(results));
  put('delivery.svg', delivery);
  svgs.push(delivery);
  put(
    'report.html',
    htmlReport(`quotaplane simulation: ${outcome.scenario.name}`, results, resultsTable(results), svgs),
  );
  return written;
}

/** Write every scenario: into `dir` itself for one, into `dir/<scenario>/` plus a combined results.json for several. */
export function writeOutputs(dir: string, outcomes: readonly ScenarioOutcome[]): string[] {
  if (outcomes.length === 1) return writeScenario(dir, outcomes[0]!);
  const perScenario = outcomes.flatMap((o) => writeScenario(join(dir, o.scenario.name), o));
  const { put, written } = outputFiles(dir);
  put('results.json', resultsJson(outcomes.flatMap((o) => o.results)));
  return [...perScenario, ...written];
}
