import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Results } from '../../../../simulations/metrics/result.js';
import { findScenario } from '../../../../simulations/scenarios/catalogue.js';
import { simulate, writeOutputs, type SimulateOptions } from '../../../../simulations/simulate.js';
import { strategies } from '../../../../simulations/strategies/registry.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function files(dir: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  const walk = (d: string) => {
    for (const entry of readdirSync(d, { withFileTypes: true })) {
      const path = join(d, entry.name);
      if (entry.isDirectory()) walk(path);
      else out.set(relative(dir, path), readFileSync(path));
    }
  };
  walk(dir);
  return out;
}

function runTo(seed: number, extra: Partial<SimulateOptions> = {}): Map<string, Buffer> {
  const dir = mkdtempSync(join(tmpdir(), 'qp-sim-'));
  dirs.push(dir);
  const options: SimulateOptions = {
    // Network randomness (strict, the dynamic control planes, jitter, loss), client retries and a partition:
    // every source of randomness.
    scenarios: [findScenario('ignore-retry-after')!, findScenario('region-partition')!],
    strategies,
    regionCount: 3,
    seed,
    overrides: { durationS: '60', faultAtS: '20', faultForS: '10', linkLoss: '0.05' },
    ...extra,
  };
  writeOutputs(dir, simulate(options));
  return files(dir);
}

describe('same seed, same bytes', () => {
  it('writes byte-identical results.json, charts and report for the same seed', () => {
    const a = runTo(1234);
    const b = runTo(1234);
    expect([...a.keys()].sort()).toEqual([
      'ignore-retry-after/admitted.svg',
      'ignore-retry-after/delivery.svg',
      'ignore-retry-after/report.html',
      'ignore-retry-after/results.json',
      'ignore-retry-after/shares.svg',
      'region-partition/admitted.svg',
      'region-partition/delivery.svg',
      'region-partition/report.html',
      'region-partition/results.json',
      'region-partition/shares.svg',
      'results.json',
    ]);
    for (const [name, bytes] of a) expect(bytes.equals(b.get(name)!), name).toBe(true);
    const results = Results.parse(JSON.parse(a.get('results.json')!.toString('utf8')));
    const names = ['ideal', 'independent', 'static', 'strict', 'dynamic', 'naive-dynamic'];
    expect(results.map((r) => `${r.scenario}/${r.strategy}`)).toEqual([
      ...names.map((n) => `ignore-retry-after/${n}`),
      ...names.map((n) => `region-partition/${n}`),
    ]);
  });

  it('draws different arrivals for another seed', () => {
    const a = runTo(1);
    const b = runTo(2);
    expect(a.get('results.json')!.equals(b.get('results.json')!)).toBe(false);
  });

  it('writes a sweep as one object per value and strategy, with the trade-off chart', () => {
    const out = runTo(5, {
      scenarios: [findScenario('uniform')!],
      strategies: strategies.filter((s) => s.name === 'static' || s.name === 'ideal'),
      overrides: { durationS: '60' },
      sweep: { setting: 'overcommit', values: ['1', '2'] },
    });
    expect([...out.keys()].sort()).toEqual(['delivery.svg', 'report.html', 'results.json', 'tradeoff.svg']);
    const results = Results.parse(JSON.parse(out.get('results.json')!.toString('utf8')));
    expect(results.map((r) => [r.strategy, r.sweep?.value])).toEqual([
      ['ideal', 1],
      ['static', 1],
      ['ideal', 2],
      ['static', 2],
    ]);
    // Overcommitting trades overshoot for fewer false denials.
    const [, static1, , static2] = results;
    expect(static1!.overAdmission).toBeLessThanOrEqual(1);
    expect(static2!.overAdmission).toBeGreaterThan(1);
    expect(static2!.falseDenialRate).toBeLessThan(static1!.falseDenialRate);
    expect(out.get('tradeoff.svg')!.toString('utf8')).toContain('points labelled with overcommit');
    expect(out.get('delivery.svg')!.toString('utf8')).toContain('points labelled with overcommit');
  });
});
