import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseCli, usage } from '../../../simulations/cli-args.js';
import { SimConfigError } from '../../../simulations/errors.js';
import * as files from '../../../simulations/report/files.js';
import { progressSink } from '../../../simulations/report/progress.js';
import { niceTicks } from '../../../simulations/report/svg.js';
import { planRuns } from '../../../simulations/simulate.js';

const parsed = (...argv: string[]) => {
  const p = parseCli(argv);
  if (p.help) throw new Error('unexpected --help');
  return p;
};

describe('CLI arguments', () => {
  it('fills defaults: every strategy, 3 regions, seed 1, an output folder per scenario', () => {
    const p = parsed('--scenario', 'zipf');
    expect(p.strategies.map((s) => s.name)).toEqual([
      'ideal',
      'independent',
      'static',
      'strict',
      'dynamic',
      'naive-dynamic',
    ]);
    expect([p.regionCount, p.seed, p.outDir, p.quiet]).toEqual([3, 1, '.sim-out/zipf', false]);
    expect(parsed('--scenario', 'all').scenarios).toHaveLength(17);
    expect(parseCli(['--help'])).toEqual({ help: true });
  });

  it('layers --duration and --set, and validates the values before any run', () => {
    const p = parsed(
      '--scenario',
      'uniform',
      '--duration',
      '90',
      '--set',
      'capacity=50',
      '--set',
      'linkLoss=0.5',
    );
    expect(p.overrides).toEqual({ durationS: '90', capacity: '50', linkLoss: '0.5' });
    const [spec] = planRuns(p);
    expect(spec!.settings).toMatchObject({ durationS: 90, capacity: 50, linkLoss: 0.5, subjects: 20 });
    expect(() => planRuns(parsed('--scenario', 'uniform', '--set', 'maxCost=500'))).toThrow(
      /maxCost must be ≤ capacity/,
    );
    expect(() => planRuns(parsed('--scenario', 'uniform', '--set', 'onStoreFailure=open'))).toThrow(
      /may not fail open/,
    );
    expect(() => parsed('--scenario', 'uniform', '--set', 'capacity=1', '--set', 'capacity=2')).toThrow(
      /twice/,
    );
    expect(() => parsed('--scenario', 'uniform', '--duration', '9', '--set', 'durationS=9')).toThrow(/both/);
    expect(() => parsed('--scenario', 'uniform', '--set', 'capacity')).toThrow(/NAME=VALUE/);
  });

  it('plans one run per swept value and strategy, and notes a setting nothing reads', () => {
    const p = parsed('--scenario', 'uniform', '--strategies', 'static', '--sweep', 'overcommit=1,2,3');
    expect(p.warnings).toEqual([]);
    expect(planRuns(p).map((r) => r.settings.overcommit)).toEqual([1, 2, 3]);
    const idle = parsed(
      '--scenario',
      'uniform',
      '--strategies',
      'static',
      '--sweep',
      'forwardTimeoutMs=100,200',
    );
    expect(idle.warnings[0]).toMatch(/forwardTimeoutMs is read by none/);
    expect(
      parsed('--scenario', 'uniform', '--strategies', 'strict', '--sweep', 'linkLoss=0,0.1').warnings,
    ).toEqual([]);
    expect(() => parsed('--scenario', 'uniform', '--sweep', 'overcommit=1,1')).toThrow(/repeated/);
    expect(() => parsed('--scenario', 'uniform', '--sweep', 'overcommit=1', '--set', 'overcommit=2')).toThrow(
      /conflicts/,
    );
  });

  it('knows warmupS is read by every run, and homeRegion by every strategy with a coordinator or a home', () => {
    for (const [strategy, sweep] of [
      ['static', 'warmupS=0,60'],
      ['ideal', 'warmupS=0,60'],
      ['dynamic', 'homeRegion=us,eu'],
      ['naive-dynamic', 'homeRegion=us,eu'],
      ['strict', 'homeRegion=us,eu'],
    ] as const) {
      const p = parsed('--scenario', 'uniform', '--strategies', strategy, '--sweep', sweep);
      expect(p.warnings, `${strategy} ${sweep}`).toEqual([]);
    }
    // A strategy that sends no message and has no home still reads no homeRegion: the note stays.
    expect(
      parsed('--scenario', 'uniform', '--strategies', 'static', '--sweep', 'homeRegion=us,eu').warnings,
    ).toEqual([
      'note: homeRegion is read by none of the chosen scenarios or strategies; every swept run will be the same',
    ]);
  });

  it('refuses a blank number rather than reading it as 0', () => {
    for (const value of ['', ' ']) {
      expect(() => planRuns(parsed('--scenario', 'uniform', '--set', `maxRetries=${value}`))).toThrow(
        new SimConfigError('invalid settings for uniform: maxRetries: must be a number'),
      );
      expect(() => planRuns(parsed('--scenario', 'uniform', '--duration', value))).toThrow(
        new SimConfigError('invalid settings for uniform: durationS: must be a number'),
      );
    }
    expect(() => planRuns(parsed('--scenario', 'uniform', '--set', 'maxRetries=many'))).toThrow(
      new SimConfigError('invalid settings for uniform: maxRetries: must be a number'),
    );
    expect(planRuns(parsed('--scenario', 'uniform', '--set', 'maxRetries=0'))[0]!.settings.maxRetries).toBe(
      0,
    );
  });

  it('names the strategy whose policy is invalid and the setting to change', () => {
    expect(() =>
      planRuns(
        parsed(
          '--scenario',
          'uniform',
          '--strategies',
          'static,dynamic',
          '--set',
          'maxCost=10',
          '--set',
          'minShare=0.05',
        ),
      ),
    ).toThrow(
      new SimConfigError(
        'the policy dynamic enforces is invalid: minShare: minShare × capacity must be ≥ maxCost (10) so a region holding a share can admit the largest cost; change --set minShare=… (≥ maxCost / capacity = 0.1)',
      ),
    );
    // static sets no minShare: the same settings are a valid policy for it.
    expect(
      planRuns(
        parsed(
          '--scenario',
          'uniform',
          '--strategies',
          'static',
          '--set',
          'maxCost=10',
          '--set',
          'minShare=0.05',
        ),
      ),
    ).toHaveLength(1);
  });

  it('refuses a cold-start idle spell that starts or ends after the run', () => {
    expect(() =>
      planRuns(parsed('--scenario', 'cold-start', '--duration', '100', '--set', 'idleAtS=120')),
    ).toThrow(
      new SimConfigError('cold-start: idleAtS (120) must be before the end of the run (durationS 100)'),
    );
    expect(() =>
      planRuns(parsed('--scenario', 'cold-start', '--duration', '100', '--set', 'idleForS=50')),
    ).toThrow(
      new SimConfigError(
        'cold-start: idleAtS + idleForS (110) must be before the end of the run (durationS 100)',
      ),
    );
    expect(
      planRuns(parsed('--scenario', 'cold-start', '--duration', '100', '--set', 'idleForS=39')),
    ).not.toHaveLength(0);
    // Other scenarios read neither: their defaults beyond a short run are no error.
    expect(() =>
      planRuns(parsed('--scenario', 'uniform', '--duration', '50', '--set', 'idleAtS=120')),
    ).not.toThrow();
  });

  it('refuses bad input with SimConfigError', () => {
    for (const argv of [
      ['--scenario', 'uniform,uniform'],
      ['--scenario', 'uniform', '--regions', '0'],
      ['--scenario', 'uniform', '--regions', '2.5'],
      ['--scenario', 'uniform', '--seed', 'x'],
      ['--scenario', 'uniform', '--strategies', ''],
      ['--scenario', 'uniform', '--out', ' '],
      ['--scenario', 'uniform', 'positional'],
    ]) {
      expect(() => parseCli(argv), argv.join(' ')).toThrow(SimConfigError);
    }
    // Checked against this run's regions before anything runs.
    expect(() => planRuns(parsed('--scenario', 'uniform', '--set', 'homeRegion=sa'))).toThrow(
      /homeRegion sa is not one of this run's regions/,
    );
    expect(() =>
      planRuns(parsed('--scenario', 'uniform', '--regions', '4', '--set', 'homeRegion=sa')),
    ).not.toThrow();
    expect(() => planRuns(parsed('--scenario', 'uniform', '--set', 'links=us-oc=1/1/0'))).toThrow(
      /unknown region oc/,
    );
  });

  it('refuses a link override whose delay or jitter is not a number, before any run', () => {
    // `1.2.3` and `.` pass the setting's pattern but read as NaN: a NaN delay ended the run after a few requests.
    for (const links of ['us-eu=1.2.3/1/0', 'eu-ap=./10/0', 'us-eu=10/1..5/0']) {
      expect(() => planRuns(parsed('--scenario', 'uniform', '--set', `links=${links}`)), links).toThrow(
        /links: delay and jitter of [a-z]+-[a-z]+ must be numbers of ms ≥ 0/,
      );
    }
    expect(() => planRuns(parsed('--scenario', 'uniform', '--set', 'links=us-eu=.5/0.25/0'))).not.toThrow();
  });

  it('refuses an --out that cannot be a folder before any run, and creates one that can', () => {
    const dir = mkdtempSync(join(tmpdir(), 'qp-sim-out-'));
    try {
      const file = join(dir, 'results');
      writeFileSync(file, '');
      // The CLI calls it before the first run: a SimConfigError is exit code 2 with the reason, no stack trace.
      const prepare = (out: string) => () => files.prepareOutDir(out);
      expect(prepare(file)).toThrow(SimConfigError);
      expect(prepare(file)).toThrow(/--out .*results is a file, not a folder/);
      expect(prepare(join(file, 'sub'))).toThrow(/--out .*sub: cannot create the output folder \(ENOTDIR/);
      prepare(join(dir, 'a', 'b'))();
      expect(statSync(join(dir, 'a', 'b')).isDirectory()).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('documents every scenario and strategy in --help', () => {
    const text = usage();
    expect(text).toContain('one-shot-identities');
    expect(text).toContain('naive-dynamic');
    expect(text).toContain('convergenceHoldS');
  });
});

describe('progress', () => {
  const sink = (isTTY: boolean) => {
    const out: string[] = [];
    return { out, stream: { isTTY, columns: 100, write: (t: string) => out.push(t) } };
  };

  it('draws a bar on a terminal, plain lines at each 10% elsewhere, nothing when quiet', () => {
    const tty = sink(true);
    const bar = progressSink(tty.stream, false);
    bar.update(0, 2, 0.5, 'uniform/static');
    bar.update(1, 2, 1, 'uniform/strict');
    bar.finish();
    expect(tty.out[0]).toMatch(/^\r█+░+ +25\.0% {2}run 1\/2 uniform\/static/);
    expect(tty.out.at(-1)).toBe('\n');

    const pipe = sink(false);
    const lines = progressSink(pipe.stream, false);
    for (let i = 0; i <= 20; i++) lines.update(0, 1, i / 20, 'x');
    expect(pipe.out).toEqual(Array.from({ length: 11 }, (_, i) => `simulate: ${i * 10}%\n`));

    // A terminal that reports no width still gets the bar.
    const narrow = { out: [] as string[], isTTY: true, columns: 0 };
    progressSink({ ...narrow, write: (t: string) => narrow.out.push(t) }, false).update(0, 1, 0.5, 'x');
    expect(narrow.out[0]).toContain('50.0%');

    const quiet = sink(true);
    progressSink(quiet.stream, true).update(0, 1, 0.5, 'x');
    expect(quiet.out).toEqual([]);
  });
});

describe('chart axes', () => {
  it('picks round ticks', () => {
    expect(niceTicks(0, 300)).toEqual([0, 100, 200, 300]);
    expect(niceTicks(0, 120)).toEqual([0, 25, 50, 75, 100]);
    expect(niceTicks(0, 1.05)).toEqual([0, 0.25, 0.5, 0.75, 1]);
  });
});
