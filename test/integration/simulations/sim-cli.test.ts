/** The CLI as a user runs it: a real process, its exit code, its streams and the files it writes. */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Results } from '../../../simulations/metrics/result.js';
import { scenarios } from '../../../simulations/scenarios/catalogue.js';

const root = join(import.meta.dirname, '..', '..', '..');
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function simulate(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', 'simulations/cli.ts', ...args],
      { cwd: root, timeout: 110_000 },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === 'number' ? error.code : -1;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

// Every test starts node with tsx, which compiles the simulator first; the scenario run then simulates six
// strategies for 180 s. The default 20 s was missed at a load average above 20 on two cores.
describe('npm run simulate', { timeout: 60_000 }, () => {
  it('lists scenarios, strategies and settings with --help', async () => {
    const { code, stdout } = await simulate('--help');
    expect(code).toBe(0);
    for (const s of scenarios) expect(stdout).toContain(s.name);
    for (const s of ['ideal', 'independent', 'static', 'strict', 'dynamic', 'naive-dynamic'])
      expect(stdout).toContain(s);
    expect(stdout).not.toContain('not yet available');
    expect(stdout).toContain('overcommit');
    expect(stdout).toContain('leaseMs');
    expect(stdout).toContain('--sweep');
  });

  it.each([
    [['--scenario', 'nope'], /unknown scenario nope/],
    [['--scenario', 'uniform', '--strategies', 'static,bogus'], /unknown strategy bogus/],
    [
      ['--scenario', 'uniform', '--strategies', 'dynamic', '--set', 'graceMs=5000'],
      /graceMs must be longer than leaseMs/,
    ],
    [
      ['--scenario', 'uniform', '--strategies', 'naive-dynamic', '--set', 'minShare=0.5'],
      /exceeds the budget/,
    ],
    [['--scenario', 'uniform', '--regions', '9'], /--regions must be an integer in \[1, 8\]/],
    [['--scenario', 'uniform', '--seed', '-3'], /--seed/],
    [['--scenario', 'uniform', '--set', 'capacity=-1'], /capacity/],
    // A blank value is no number, not 0.
    [
      ['--scenario', 'uniform', '--set', 'maxRetries='],
      /invalid settings for uniform: maxRetries: must be a number/,
    ],
    [['--scenario', 'uniform', '--set', 'colour=blue'], /unknown setting colour/],
    [['--scenario', 'uniform', '--sweep', 'linkLoss=0.1,2'], /linkLoss/],
    [['--scenario', 'step-shift', '--duration', '100', '--set', 'shiftAtS=150'], /shiftAtS/],
    [['--scenario', 'uniform', '--bogus'], /Unknown option '--bogus'/],
    [['--strategies', 'static'], /--scenario is required/],
  ])('refuses %j with a clear message and exit code 2', async (args, message) => {
    const { code, stderr, stdout } = await simulate(...args);
    expect(code).toBe(2);
    expect(stderr).toMatch(message);
    expect(stdout).toBe('');
  });

  it('runs a scenario: table on stdout, progress on stderr, results.json and charts in --out', async () => {
    const out = mkdtempSync(join(tmpdir(), 'qp-sim-cli-'));
    dirs.push(out);
    const args = [
      '--scenario',
      'minute-burst',
      '--regions',
      '3',
      '--seed',
      '7',
      '--duration',
      '180',
      '--out',
      out,
    ];
    const { code, stdout, stderr } = await simulate(
      ...args,
      '--strategies',
      'ideal,independent,static,strict,dynamic,naive-dynamic',
    );
    expect(code).toBe(0);
    expect(stdout).toMatch(/\| strategy +\| overAdmission/);
    // stderr is a pipe here, not a terminal: plain percentage lines.
    expect(stderr).toContain('simulate: 100%');
    expect(stderr).not.toContain('\r');
    for (const f of ['results.json', 'admitted.svg', 'shares.svg', 'report.html'])
      expect(existsSync(join(out, f)), f).toBe(true);
    const results = Results.parse(JSON.parse(readFileSync(join(out, 'results.json'), 'utf8')));
    expect(results.map((r) => r.strategy)).toEqual([
      'ideal',
      'independent',
      'static',
      'strict',
      'dynamic',
      'naive-dynamic',
    ]);
    const dynamic = results.find((r) => r.strategy === 'dynamic')!;
    expect(dynamic.overAdmission).toBeLessThanOrEqual(1);
    expect(dynamic.maxShareSum).toBeLessThanOrEqual(1);
    expect(dynamic.controlMessagesPerSecond).toBeGreaterThan(0);
    expect(readFileSync(join(out, 'shares.svg'), 'utf8')).toContain('shares in force, dynamic');
    const independent = results.find((r) => r.strategy === 'independent')!;
    expect(independent.overAdmission).toBeGreaterThan(2.8);
    expect(results.find((r) => r.strategy === 'static')!.overAdmission).toBeLessThanOrEqual(1);
    expect(readFileSync(join(out, 'admitted.svg'), 'utf8')).toMatch(
      /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/,
    );
    expect(readFileSync(join(out, 'report.html'), 'utf8')).toContain('<svg');
  }, 120_000);
});
