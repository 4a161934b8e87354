/**
 * The charts of a run: admitted rate against the budget over time (the hottest subject, then every subject
 * together), shares over time per strategy, delivery against over-admission per strategy, and for sweeps the
 * overshoot / false-denial trade-off.
 */
import { ownValue } from '../../core/own-keys.js';
import type { RunSeries } from '../metrics/recorder.js';
import type { StrategyResult } from '../metrics/result.js';
import { svgDocument, type ChartOptions, type Series } from './svg.js';

const STRATEGY_COLORS: Record<string, string> = {
  ideal: '#222222',
  independent: '#d62728',
  static: '#1f77b4',
  strict: '#2ca02c',
  dynamic: '#9467bd',
  'naive-dynamic': '#ff7f0e',
};
const EXTRA_COLORS = ['#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];
const REGION_COLORS = [
  '#1f77b4',
  '#ff7f0e',
  '#2ca02c',
  '#d62728',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#17becf',
];

export function strategyColor(name: string, index: number): string {
  return ownValue(STRATEGY_COLORS, name) ?? EXTRA_COLORS[index % EXTRA_COLORS.length]!;
}

/** One run of a strategy, with what its charts need. */
export interface ChartRun {
  result: StrategyResult;
  series: RunSeries;
}

function perSecond(bins: Float64Array, binS: number): [number, number][] {
  return Array.from(bins, (v, i) => [i * binS, v / binS] as [number, number]);
}

/** Admitted tokens/s of the hottest subject per strategy, the oracle's, and the budget R. */
export function admittedCharts(
  runs: readonly ChartRun[],
  capacity: number,
  refillPerSecond: number,
): ChartOptions[] {
  const first = runs[0];
  if (first === undefined) return [];
  const { binS, focusSubject } = first.series;
  const durationS = first.result.durationS;
  const budget: Series = {
    label: `budget R = ${refillPerSecond}/s`,
    color: '#000000',
    dashed: true,
    points: [
      [0, refillPerSecond],
      [durationS, refillPerSecond],
    ],
  };
  const binBudget = (capacity + refillPerSecond * binS) / binS;
  const burst: Series = {
    label: `most one bin may hold: (C + R·${binS} s) / ${binS} s`,
    color: '#000000',
    dashed: true,
    points: [
      [0, binBudget],
      [durationS, binBudget],
    ],
  };
  const oracle = (bins: Float64Array): Series => ({
    label: 'ideal (oracle, same arrivals)',
    color: '#999999',
    dashed: true,
    points: perSecond(bins, binS),
  });
  const lines = (pick: (r: ChartRun) => Float64Array): Series[] =>
    runs.map((r, i) => ({
      label: r.result.strategy,
      color: strategyColor(r.result.strategy, i),
      points: perSecond(pick(r), binS),
    }));
  const scenario = first.result.scenario;
  const focus = lines((r) => r.series.focusAdmitted);
  // The burst allowance only helps where something comes near it; elsewhere it would flatten the chart.
  const peak = Math.max(...focus.flatMap((s) => s.points.map((p) => p[1])));
  return [
    {
      title: `${scenario}: admitted rate of subject ${focusSubject} (the hottest) against its budget`,
      xLabel: 'simulated time, s',
      yLabel: `tokens/s (per ${binS} s bin)`,
      series: [...focus, oracle(first.series.focusIdeal), budget, ...(peak > binBudget / 4 ? [burst] : [])],
    },
    {
      title: `${scenario}: admitted rate, all subjects`,
      xLabel: 'simulated time, s',
      yLabel: `tokens/s (per ${binS} s bin)`,
      series: [...lines((r) => r.series.admitted), oracle(first.series.ideal)],
      xInclude: [0, durationS],
    },
  ];
}

/**
 * For each strategy with a regional split, the share per region in force at the start of each bin (the policy's
 * own vector) and the sum (≤ 1 conserves the budget).
 */
export function shareCharts(runs: readonly ChartRun[]): ChartOptions[] {
  return runs.flatMap((r) => {
    const samples = r.series.shares;
    if (samples === undefined) return [];
    const { binS } = r.series;
    const n = r.result.regions.length;
    const series: Series[] = r.result.regions.map((region, k) => ({
      label: region,
      color: REGION_COLORS[k % REGION_COLORS.length]!,
      // Equal shares coincide: each region is drawn narrower than the one before, so all stay visible.
      width: 1.5 + 2.5 * (n - 1 - k),
      points: samples.map((s, i) => [i * binS, s[k]!] as [number, number]),
    }));
    // Strategies that report every change draw the largest sum in force within each bin, so a sum above 1 for
    // a few milliseconds shows; the others their sampled sum.
    const sums = r.series.shareSumMax;
    series.push({
      label: sums === undefined ? 'sum of shares' : 'sum of shares (largest in the bin)',
      color: '#000000',
      dashed: true,
      points:
        sums === undefined
          ? samples.map((s, i) => [i * binS, s.reduce((a, b) => a + b, 0)] as [number, number])
          : Array.from(sums, (v, i) => [i * binS, v] as [number, number]),
    });
    return [
      {
        title: `${r.result.scenario}: shares in force, ${r.result.strategy}`,
        xLabel: 'simulated time, s',
        yLabel: 'share of the budget',
        series,
        height: 220,
        yInclude: [0, 1],
        xInclude: [0, r.result.durationS],
      },
    ];
  });
}

/** Overshoot against false denials, one line per strategy, one point per swept value. */
export function tradeoffChart(results: readonly StrategyResult[]): ChartOptions[] {
  const setting = results[0]?.sweep?.setting;
  if (setting === undefined) return [];
  const names = [...new Set(results.map((r) => r.strategy))];
  const series: Series[] = names.map((name, i) => {
    const mine = results.filter((r) => r.strategy === name);
    return {
      label: name,
      color: strategyColor(name, i),
      points: mine.map((r) => [r.falseDenialRate, r.overAdmission] as [number, number]),
      pointLabels: mine.map((r) => String(r.sweep!.value)),
    };
  });
  const xs = results.map((r) => r.falseDenialRate);
  series.push({
    label: 'budget (overAdmission = 1)',
    color: '#000000',
    dashed: true,
    points: [
      [Math.min(0, ...xs), 1],
      [Math.max(0.01, ...xs), 1],
    ],
  });
  return [
    {
      title: `${results[0]!.scenario}: overshoot against false denials; points labelled with ${setting}`,
      xLabel: 'false-denial rate (denied by the strategy, admitted by ideal) / requests',
      yLabel: 'overAdmission (worst window / budget)',
      series,
      height: 380,
      yInclude: [0, 1],
    },
  ];
}

/** Text size of the delivery chart, px: read at the width a README shows it. */
export const DELIVERY_FONT_SIZE = 15;

/**
 * Delivery against over-admission (docs/design.md, "What the simulator measures"): one dot per strategy, or with a
 * sweep one line per strategy, a dot per swept value labelled with it. Across: over-admission, the worst subject's
 * most-admitted window over what the budget allows in it (C + R·W); past 1 the budget was exceeded. Up: delivery,
 * the cost admitted as a percentage of what the ideal global bucket admitted on the same arrivals (the demand the
 * budget allows). Up and left is better; a run without an ideal admission (utilisation null) has no dot. The axes
 * span the dots and at least 0.9-1.1 × budget and 90-100%.
 */
export function deliveryChart(results: readonly StrategyResult[]): ChartOptions[] {
  if (results.length === 0) return [];
  const setting = results[0]!.sweep?.setting;
  const names = [...new Set(results.map((r) => r.strategy))];
  const series: Series[] = names.map((name, i) => {
    const mine = results.filter((r) => r.strategy === name && r.utilisation !== null);
    // A strategy the swept setting does not move is one dot, which the legend names.
    const moves = mine.some(
      (r) => r.overAdmission !== mine[0]!.overAdmission || r.utilisation !== mine[0]!.utilisation,
    );
    return {
      label: name,
      color: strategyColor(name, i),
      width: 2,
      dots: true,
      points: mine.map((r) => [r.overAdmission, 100 * r.utilisation!] as [number, number]),
      ...(setting === undefined || !moves ? {} : { pointLabels: mine.map((r) => String(r.sweep!.value)) }),
    };
  });
  const ys = series.flatMap((s) => s.points.map((p) => p[1]));
  series.push({
    label: 'budget: over-admission = 1',
    color: '#000000',
    dashed: true,
    points: [
      [1, Math.min(90, ...ys)],
      [1, Math.max(100, ...ys)],
    ],
  });
  return [
    {
      title: `${results[0]!.scenario}: delivery against over-admission${setting === undefined ? '' : `, points labelled with ${setting}`}`,
      xLabel: 'over-admission: worst window admitted / (C + R·W), × budget',
      yLabel: 'delivery: % of what the ideal bucket admitted',
      series,
      width: 860,
      height: 460,
      fontSize: DELIVERY_FONT_SIZE,
      tight: true,
      xInclude: [0.9, 1.1],
      yInclude: [90, 100],
    },
  ];
}

/**
 * The chart files of one scenario's runs: `admitted.svg` always, `shares.svg` when a run has shares. The policy's
 * capacity and refill come from the first run's settings.
 */
export function runChartFiles(runs: readonly ChartRun[]): { name: string; svg: string }[] {
  const setting = (name: string) => Number(ownValue(runs[0]?.result.settings, name) ?? 0);
  const files = [
    {
      name: 'admitted.svg',
      svg: svgDocument(admittedCharts(runs, setting('capacity'), setting('refillPerSecond'))),
    },
  ];
  const shareParts = shareCharts(runs);
  if (shareParts.length > 0) files.push({ name: 'shares.svg', svg: svgDocument(shareParts) });
  return files;
}
