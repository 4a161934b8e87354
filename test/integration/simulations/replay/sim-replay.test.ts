/**
 * `npm run simulate -- --real-stack` as a user runs it: the CLI as a real process, which starts `npm start`'s
 * launcher on free loopback ports (real redis-server and nats-server from PATH, the real coordinator and agents),
 * replays a scenario's arrivals against it in compressed time and prints the stack's metrics beside the
 * simulator's prediction. Checked: the rows and their schema, what the stack must guarantee (no lost decision,
 * shares that never sum above 1, a strict bucket that never admits more than its budget allows), how far the
 * real stack's utilisation may stray from the prediction, the files, and that nothing of the stack is left
 * behind, after a normal end and after Ctrl-C. Also a refusal before any stack starts, and the key counter on a
 * Redis of its own.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, afterEach, describe, expect, it, onTestFailed } from 'vitest';
import type { StackState } from '../../../../scripts/stack/launcher.js';
import { DEFAULT_DECISION_DEADLINE_MS } from '../../../../regional-agent/config.js';
import { parseCli } from '../../../../simulations/cli-args.js';
import { KeyCounter } from '../../../../simulations/replay/key-counter.js';
import { planReplay } from '../../../../simulations/replay/replay-plan.js';
import {
  predictedRow,
  ReplayResults,
  type ReplayResult,
} from '../../../../simulations/replay/replay-result.js';
import { backend } from '../../../harness/fixtures.js';
import { freePort } from '../../../harness/ports.js';
import { leftovers, portsOf, takenOf } from '../../../helpers/stack-state.js';
import { eventually } from '../../../helpers/wait.js';
import { within } from '../../../helpers/within.js';

const ROOT = join(import.meta.dirname, '..', '..', '..', '..');
const dirs: string[] = [];

/** Remove `dir` after the file's tests, unless the current test fails: then it is kept, and named on stderr. */
function removeUnlessFailed(dir: string, what: string): void {
  dirs.push(dir);
  onTestFailed(() => {
    dirs.splice(dirs.indexOf(dir), 1);
    process.stderr.write(`sim-replay: kept ${dir} (${what}) for the post-mortem\n`);
  });
}

function scratch(): string {
  const dir = mkdtempSync(join(tmpdir(), 'qp-sim-replay-'));
  removeUnlessFailed(dir, 'results.json, stack.log');
  return dir;
}

afterAll(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** The caller's environment without QP_* variables: the replay refuses to start a stack over its own. */
function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('QP_')) env[k] = v;
  return { ...env, ...extra };
}

interface CliRun {
  readonly child: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  stdout(): string;
  stderr(): string;
  /** The launcher's state file as it was while the stack ran (it removes the file when it stops). */
  state(): StackState | undefined;
}

const running: CliRun[] = [];

// A test that failed half-way must not leave a replay (and its stack) running: SIGTERM stops both; a replay
// that does not answer it is killed, and its launcher, seeing its parent gone, stops the stack by itself.
afterEach(async () => {
  for (const run of running.splice(0)) {
    if (run.child.exitCode !== null || run.child.signalCode !== null) continue;
    run.child.kill('SIGTERM');
    const late = setTimeout(() => run.child.kill('SIGKILL'), 15_000);
    await run.exited;
    clearTimeout(late);
  }
}, 30_000);

/** `node --import tsx simulations/cli.ts …`; with `out`, the state file there is read once the stack is ready. */
function simulate(args: readonly string[], out?: string, env = cleanEnv()): CliRun {
  const child = spawn(process.execPath, ['--import', 'tsx', 'simulations/cli.ts', ...args], {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  let state: StackState | undefined;
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => {
    stderr += d.toString();
    // runReplay says "stack ready" once the state file exists; the launcher removes it only when stopped.
    if (state === undefined && out !== undefined && stderr.includes('stack ready: ')) {
      try {
        state = JSON.parse(readFileSync(join(out, 'stack-state.json'), 'utf8')) as StackState;
      } catch {
        // left undefined: the test says so
      }
    }
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  );
  const run: CliRun = { child, exited, stdout: () => stdout, stderr: () => stderr, state: () => state };
  running.push(run);
  return run;
}

/** Decisions the stack's agents hold right now, admitted and not yet answered (their in-flight gauge). */
async function inFlight(state: StackState): Promise<number> {
  let sum = 0;
  for (const url of Object.values(state.agents)) {
    const text = await (await fetch(`${url}/metrics`)).text();
    sum += Number(/^quotaplane_in_flight_decisions (\d+)/m.exec(text)?.[1] ?? 0);
  }
  return sum;
}

/**
 * The stack is gone: no process, no port, no state file; its log says it stopped. Its data directory is gone too,
 * unless the test asked the launcher to keep it (`QP_STACK_KEEP_DATA`, for the services' logs): then it holds
 * them, and is removed with the test's own folder.
 */
async function expectStackGone(state: StackState, out: string, dataKept = false): Promise<void> {
  expect(leftovers(state, { launcher: true })).toEqual([]);
  expect(await takenOf(portsOf(state))).toEqual([]);
  if (dataKept) expect(existsSync(join(state.dataDir, 'logs', 'agent-us.log'))).toBe(true);
  else expect(existsSync(state.dataDir)).toBe(false);
  expect(existsSync(join(out, 'stack-state.json'))).toBe(false);
  const log = readFileSync(join(out, 'stack.log'), 'utf8');
  expect(log).toContain(`stack ${state.stackId}: logs in ${state.dataDir}/logs`);
  expect(log).toContain('stack stopped');
}

/**
 * step-shift, shortened: 150 s of scenario time (15 s of wall time per strategy at 10×), the shift at 40 s and
 * utilisation counted from there, C = 50 so the oracle's burst is spent within the run and the budget binds.
 */
const SCENARIO = [
  '--scenario',
  'step-shift',
  '--duration',
  '150',
  '--set',
  'shiftAtS=40',
  '--set',
  'warmupS=40',
  '--set',
  'capacity=50',
  '--seed',
  '1',
];

describe('npm run simulate -- --real-stack', { timeout: 180_000 }, () => {
  it('replays on a stack it starts, writes the real rows beside the prediction, and leaves nothing behind', async () => {
    const out = join(scratch(), 'out');
    const args = [...SCENARIO, '--real-stack', '--compress', '10', '--strategies', 'dynamic,strict'];
    // The services' logs (every decision, at info level) are kept for the post-mortem of a failure.
    const run = simulate([...args, '--out', out], out, cleanEnv({ QP_STACK_KEEP_DATA: 'true' }));
    const exit = await within(run.exited, 170_000, 'the replay ends');
    const state = run.state();
    if (state !== undefined) removeUnlessFailed(state.dataDir, "the services' logs: every decision");
    expect(exit, run.stderr()).toEqual({ code: 0, signal: null });

    expect(run.stdout()).toContain('step-shift (seed 1, 3 regions, real stack at 10×)');
    expect(run.stdout()).toMatch(/^\| dynamic \(real stack\) +\|/m);
    expect(run.stderr()).toContain('replaying step-shift (seed 1): ');
    for (const f of ['results.json', 'admitted.svg', 'shares.svg', 'report.html', 'stack.log'])
      expect(existsSync(join(out, f)), f).toBe(true);
    expect(readFileSync(join(out, 'admitted.svg'), 'utf8')).toMatch(
      /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/,
    );
    expect(readFileSync(join(out, 'shares.svg'), 'utf8')).toContain('dynamic (real stack)');
    const html = readFileSync(join(out, 'report.html'), 'utf8');
    expect(html).toContain('dynamic (real stack)');
    expect(html).toContain('<svg');

    const rows = ReplayResults.parse(JSON.parse(readFileSync(join(out, 'results.json'), 'utf8')));
    expect(rows.map((r) => `${r.strategy} ${r.source}`)).toEqual([
      'ideal simulator',
      'dynamic simulator',
      'dynamic real-stack',
      'strict simulator',
      'strict real-stack',
    ]);
    const row = (strategy: string, source: ReplayResult['source']) =>
      rows.find((r) => r.strategy === strategy && r.source === source)!;

    // The prediction is the simulator's own run on the plan's settings (the ones the stack enforces).
    const options = parseCli(args);
    if (options.help) throw new Error('unexpected --help');
    const plan = planReplay({ ...options, compression: 10 });
    for (const [i, spec] of plan.predictions.entries()) {
      const predicted = predictedRow(spec).result;
      expect(row(spec.strategy.name, 'simulator')).toEqual(predicted);
      if (i > 0) expect(row(spec.strategy.name, 'real-stack').settings).toEqual(predicted.settings);
    }

    const ideal = row('ideal', 'simulator');
    for (const name of ['dynamic', 'strict']) {
      const real = row(name, 'real-stack');
      // Every arrival was sent and answered: the same requests as the prediction, none without an answer (a
      // decision, denial included, or on a busy machine an explicit shed, counted apart as `shed`; a transport
      // error would count).
      expect(real.requests).toBe(ideal.requests);
      expect(real.arrivals).toBe(ideal.arrivals);
      expect(real.requests).toBeGreaterThan(4000);
      expect(real.replay!.noDecision).toBe(0);
      expect(real.counters['replay:noDecision']).toBeUndefined();
      expect(real.replay).toMatchObject({
        compression: 10,
        stack: 'started',
        wallTiming: {
          roundMs: 100,
          reportIntervalMs: 100,
          leaseMs: 600,
          graceMs: 1200,
          skewMs: 100,
          overrideTtlMs: 3000,
          decisionDeadlineMs: DEFAULT_DECISION_DEADLINE_MS,
        },
      });
      expect(real.replay!.controlMessages!.heartbeat).toBeGreaterThan(0);
    }

    // Conservation, exactly: the shares the coordinator issued never summed above the budget.
    const dynamic = row('dynamic', 'real-stack');
    expect(dynamic.replay!.shareSamples).toBeGreaterThan(100); // one per scenario second, 150 s
    // After the shift the new region's subjects borrow from the others: loan traffic is counted with the rest.
    expect(dynamic.replay!.controlMessages!.loans).toBeGreaterThan(0);
    expect(dynamic.maxShareSum).not.toBeNull();
    expect(dynamic.maxShareSum!).toBeLessThanOrEqual(1);

    // The strict bucket never admits more than C + R·W in any window of its own (Redis) time. The replay
    // counts an admission when its answer came back, up to one answer's latency after the bucket decided, so
    // a window W of answer times holds admissions decided within W + e, e the largest latency (plus 500 ppm
    // of the replay's wall time for the host clock Redis reads, which NTP may slew): overAdmission ≤
    // (C + R·(W + e)) / (C + R·W), largest at W = 1 s. Scenario time is wall time × 10, so e is tens of ms
    // of wall time, a fraction of a token at R = 2/s. Measured by hand: 0.994118 (the oracle's) or exactly 1
    // (170 of 170 in a 60 s window) in 19 runs; one run of this test measured 1.223529 (208 in a 60 s window,
    // 38 tokens more than any timing allows) and is not explained yet: the bound stays, and a failure keeps
    // the services' logs (every decision) for the post-mortem.
    const strict = row('strict', 'real-stack');
    const { capacity: C, refillPerSecond: R } = plan.settings;
    const e = ((strict.latencyMs.max + 0.0005 * strict.replay!.wallSeconds * 1000) * 10) / 1000;
    expect(
      strict.overAdmission,
      `strict: worst window ${JSON.stringify(strict.worstWindow)}, latency ${JSON.stringify(strict.latencyMs)}`,
    ).toBeLessThanOrEqual((C + R * (1 + e)) / (C + R * 1));
    expect(strict.overAdmission).toBeGreaterThan(0.9);

    // Utilisation of dynamic after the shift: the real stack within 0.05 of the prediction (0.977806, exact: the
    // simulator is deterministic; it borrows as the agents do, and predicts with the coordinator's fixed 2 s
    // confirmMs × K). Before shares moved at most 0.05 a step it predicted 0.976526, and by hand on the 2-core
    // machine, four runs idle and one beside the unit suite, the stack measured 0.960, 0.956, 0.957, 0.956 and
    // 0.958, gaps from -0.021 to -0.017. The real agents report on real
    // 100 ms timers, a loan costs a NATS round trip where the simulator's costs its modelled latency, and HTTP adds
    // milliseconds per decision (×10 in scenario time); docs/simulations.md ("How far real and predicted agree")
    // says more. Since a rebalance step's grows take all that its shrinks free (shares in force always sum to 1),
    // the prediction was 0.977806 (0.975672 before); since a start's learning ends once every registered agent
    // holds a renewal (about 3 s instead of 7 s at the deployment's own start) it is 0.975245.
    const predicted = row('dynamic', 'simulator').utilisation!;
    expect(predicted).toBe(0.975245);
    expect(
      Math.abs(dynamic.utilisation! - predicted),
      `real ${dynamic.utilisation} against predicted ${predicted}`,
    ).toBeLessThanOrEqual(0.05);

    expect(state, 'the state file was read while the stack ran').toBeDefined();
    await expectStackGone(state!, out, true);
  });

  it('stops the replay and the stack on SIGINT with answers in flight, exit code 130', async () => {
    const out = join(scratch(), 'out');
    // minute-burst uncompressed: its first burst, 2250 requests within 200 ms, starts 100 ms after the replay
    // says it is replaying and keeps hundreds of requests in flight for a good part of a second. Ctrl-C lands in
    // it: the replay must wait for those answers and stop (it once spun on its sampling loops there, for ever).
    const run = simulate(
      [
        '--scenario',
        'minute-burst',
        '--duration',
        '60',
        '--real-stack',
        '--compress',
        '1',
        '--quiet',
        '--out',
        out,
      ],
      out,
    );
    await eventually(
      () => run.stderr().includes('held by every agent; replaying'),
      120_000,
      'the replay starts',
    );
    const started = run.state();
    expect(started).toBeDefined();
    await eventually(async () => (await inFlight(started!)) > 0, 10_000, 'answers are in flight');
    const signalled = Date.now();
    run.child.kill('SIGINT');
    const exit = await within(run.exited, 60_000, 'the replay stops after SIGINT');
    expect(exit, run.stderr()).toEqual({ code: 130, signal: null });
    // Far less than the 60 s the replay would have taken: the sender stops, the stack stops in order.
    expect(Date.now() - signalled).toBeLessThan(30_000);
    expect(run.stderr()).toContain('SIGINT: stopping the replay and everything it started');
    expect(run.stderr()).toContain('simulate: SIGINT: replay stopped; the stack is stopped');
    expect(existsSync(join(out, 'results.json'))).toBe(false);
    const state = run.state();
    expect(state).toBeDefined();
    await expectStackGone(state!, out);
  });

  it('refuses what the stack cannot replay with exit code 2 before starting anything', async () => {
    const out = join(scratch(), 'out');
    const run = simulate(['--scenario', 'coordinator-crash', '--real-stack', '--out', out]);
    const exit = await within(run.exited, 30_000, 'the refusal');
    expect(exit).toEqual({ code: 2, signal: null });
    expect(run.stderr()).toBe(
      'simulate: --real-stack cannot replay coordinator-crash: the stack launcher stops every process when one of them dies, so it cannot crash and restart the coordinator alone\n',
    );
    expect(run.stdout()).toBe('');
    // Nothing was started: the output folder (where the stack's log would go) was never made.
    expect(existsSync(out)).toBe(false);
  });

  it.each([
    [{}, /^simulate: --attach needs the stack's admin token in QP_ADMIN_TOKEN\n$/],
    [{ QP_ADMIN_TOKEN: 'x'.repeat(24) }, /^simulate: --attach .*nowhere\.json: not a stack state file \(/],
  ])('refuses --attach without a token or a state file (env %j), exit 2', async (extra, message) => {
    const dir = scratch();
    const run = simulate(
      [...SCENARIO, '--attach', join(dir, 'nowhere.json'), '--quiet', '--out', join(dir, 'out')],
      undefined,
      cleanEnv(extra),
    );
    const exit = await within(run.exited, 30_000, 'the refusal');
    expect(exit).toEqual({ code: 2, signal: null });
    expect(
      run
        .stderr()
        .split('\n')
        .filter((l) => !l.startsWith('replaying '))
        .join('\n'),
    ).toMatch(message);
    expect(run.stdout()).toBe('');
  });
});

describe('KeyCounter', () => {
  it('counts the keys of each Redis, undefined for a region without one or a Redis that does not answer', async () => {
    await using redis = await backend().startRedis();
    const client = new Redis(redis.url);
    const counter = new KeyCounter([redis.url, undefined, `redis://127.0.0.1:${await freePort()}`]);
    try {
      expect(await counter.count()).toEqual([0, undefined, undefined]);
      await client.mset('a', '1', 'b', '2', 'c', '3');
      expect(await counter.count()).toEqual([3, undefined, undefined]);
    } finally {
      await counter.close();
      client.disconnect();
    }
  });
});
