import { describe, expect, it } from 'vitest';
import { AgentMetrics } from '../../../../regional-agent/observability/metrics.js';

const series = (text: string, decision: string, mode: string) =>
  Number(
    new RegExp(
      `^quotaplane_decisions_total\\{policy="writes",region="us",decision="${decision}",mode="${mode}"\\} (\\d+)$`,
      'm',
    ).exec(text)?.[1],
  );

describe('AgentMetrics.countDecision', () => {
  it('counts exactly what was decided, across scrapes, per decision and mode', async () => {
    const metrics = new AgentMetrics({ region: 'us', processMetrics: false });
    for (let i = 0; i < 7; i++) metrics.countDecision('writes', true, 'regional');
    for (let i = 0; i < 3; i++) metrics.countDecision('writes', false, 'regional');
    metrics.countDecision('writes', true, 'local');
    let text = await metrics.registry.metrics();
    expect(series(text, 'allowed', 'regional')).toBe(7);
    expect(series(text, 'denied', 'regional')).toBe(3);
    expect(series(text, 'allowed', 'local')).toBe(1);

    // A second scrape adds only what came since; a series with nothing new keeps its total.
    for (let i = 0; i < 5; i++) metrics.countDecision('writes', false, 'regional');
    text = await metrics.registry.metrics();
    expect(series(text, 'allowed', 'regional')).toBe(7);
    expect(series(text, 'denied', 'regional')).toBe(8);
    expect(series(text, 'allowed', 'local')).toBe(1);
    const counted = await metrics.decisions.get();
    expect(counted.values.reduce((n, v) => n + v.value, 0)).toBe(16);
  });
});
