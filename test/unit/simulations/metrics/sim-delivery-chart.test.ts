/**
 * The simulator's delivery chart (simulations/report/charts.ts, `delivery.svg`): delivery against over-admission
 * with both axis titles and their units, tick labels, a legend naming each strategy, a dot per strategy (or per
 * strategy and swept value) where its figures put it, and text at the chart's own, larger size.
 */
import { describe, expect, it } from 'vitest';
import type { StrategyResult } from '../../../../simulations/metrics/result.js';
import { DELIVERY_FONT_SIZE, deliveryChart, strategyColor } from '../../../../simulations/report/charts.js';
import { svgDocument } from '../../../../simulations/report/svg.js';

/** The fields the chart reads; the rest of a result does not reach it. */
function result(
  strategy: string,
  overAdmission: number,
  utilisation: number | null,
  sweep?: StrategyResult['sweep'],
): StrategyResult {
  return { scenario: 'step-shift', strategy, overAdmission, utilisation, sweep } as StrategyResult;
}

const X_TITLE = 'over-admission: worst window admitted / (C + R·W), × budget';
const Y_TITLE = 'delivery: % of what the ideal bucket admitted';

/** `<circle>`s of one colour: dots of one series (one of them in the legend). */
function dots(svg: string, color: string): { cx: number; cy: number }[] {
  return [...svg.matchAll(/<circle cx="([\d.]+)" cy="([\d.]+)" r="\d+" fill="([^"]+)"\/>/g)]
    .filter((m) => m[3] === color)
    .map((m) => ({ cx: Number(m[1]), cy: Number(m[2]) }));
}

describe('the delivery chart', () => {
  const strategies: [string, number, number | null][] = [
    ['ideal', 1, 1],
    ['independent', 2.4, 1.9],
    ['static', 0.7, 0.42],
    ['dynamic', 0.92, 0.98],
  ];
  const svg = svgDocument(deliveryChart(strategies.map(([n, o, u]) => result(n, o, u))));

  it('names both axes with their units, and labels the ticks', () => {
    expect(svg).toContain(`>${X_TITLE}</text>`);
    expect(svg).toContain(`rotate(-90)" text-anchor="middle">${Y_TITLE}</text>`);
    expect(svg).toContain('step-shift: delivery against over-admission</text>');
    // The axes span the dots: over-admission 0.7 to 2.4, delivery 42% to 190%.
    for (const tick of ['1', '1.5', '2']) expect(svg).toContain(`text-anchor="middle">${tick}</text>`);
    for (const tick of ['50', '100', '150'])
      expect(svg).toContain(`text-anchor="end" dominant-baseline="middle">${tick}</text>`);
  });

  it('draws one dot per strategy and names each in the legend', () => {
    const at: Record<string, { cx: number; cy: number }> = {};
    strategies.forEach(([name], i) => {
      expect(svg).toContain(`>${name}</text>`);
      const found = dots(svg, strategyColor(name, i));
      // The point, and the legend's mark.
      expect(found, name).toHaveLength(2);
      at[name] = found[0]!;
    });
    expect(svg).toContain('>budget: over-admission = 1</text>');
    // Where the figures put them: more over-admission to the right, more delivery higher up (smaller y).
    expect(at['independent']!.cx).toBeGreaterThan(at['ideal']!.cx);
    expect(at['ideal']!.cx).toBeGreaterThan(at['dynamic']!.cx);
    expect(at['dynamic']!.cx).toBeGreaterThan(at['static']!.cx);
    expect(at['independent']!.cy).toBeLessThan(at['ideal']!.cy);
    expect(at['ideal']!.cy).toBeLessThan(at['dynamic']!.cy);
    expect(at['dynamic']!.cy).toBeLessThan(at['static']!.cy);
  });

  it('writes its text larger than the time charts', () => {
    expect(DELIVERY_FONT_SIZE).toBeGreaterThanOrEqual(14);
    expect(svg).toContain(`<g font-size="${DELIVERY_FONT_SIZE}">`);
  });

  it('leaves out a run whose oracle admitted nothing, and keeps its legend entry', () => {
    const chart = svgDocument(deliveryChart([result('ideal', 1, 1), result('strict', 0, null)]));
    expect(dots(chart, strategyColor('strict', 1))).toHaveLength(1);
    expect(chart).toContain('>strict</text>');
  });

  it('draws a sweep as a line per strategy, a dot per value labelled with it', () => {
    const chart = svgDocument(
      deliveryChart(
        [1, 1.5, 2].flatMap((v) => [
          result('static', 0.7 * v, 0.42 * v, { setting: 'overcommit', value: v }),
          result('dynamic', 0.92, 0.98, { setting: 'overcommit', value: v }),
        ]),
      ),
    );
    expect(chart).toContain('delivery against over-admission, points labelled with overcommit</text>');
    // static moves with overcommit: three dots, labelled 1, 1.5 and 2; dynamic does not read it: one dot, no label.
    expect(dots(chart, strategyColor('static', 0)).length - 1).toBe(3);
    for (const v of ['1', '1.5', '2'])
      expect(chart).toMatch(new RegExp(`fill="${strategyColor('static', 0)}">${v}</text>`));
    expect(dots(chart, strategyColor('dynamic', 1)).length - 1).toBe(1);
    expect(chart).not.toContain(`fill="${strategyColor('dynamic', 1)}">1`);
  });
});
