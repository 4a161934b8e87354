/**
 * `npm run simulate -- …`: the only file of simulations/ that reads argv and the environment, writes to the
 * terminal, handles signals and exits.
 * Exit codes: 0 done, 2 bad flags or settings (message on stderr), 1 anything unexpected or, with --real-stack,
 * a stack that did not start or failed; 130 a replay stopped by Ctrl-C (everything it started is stopped).
 */
import { fileURLToPath } from 'node:url';
import { parseCli, usage, type CliOptions } from './cli-args.js';
import { SimConfigError } from './errors.js';
import { ReplayError, ReplayInterrupted } from './replay/replay-errors.js';
import { replayProgress } from './replay/replay-progress.js';
import { runReplay } from './replay/replay-run.js';
import { prepareOutDir } from './report/files.js';
import { progressSink } from './report/progress.js';
import { resultsTable } from './report/table.js';
import { planRuns, simulate, writeOutputs } from './simulate.js';

/** Signals closer together than this are one request (npm forwards the terminal's Ctrl-C a second time). */
const REPEAT_MS = 2000;

/** `--real-stack`: the replay, with Ctrl-C stopping it cleanly (a second one, later, exits at once). */
async function replay(options: CliOptions, realStack: NonNullable<CliOptions['realStack']>): Promise<number> {
  const abort = new AbortController();
  let firstAt = 0;
  const onSignal = (signal: NodeJS.Signals) => {
    const now = Date.now();
    if (firstAt === 0) {
      firstAt = now;
      process.stderr.write(
        `\n${signal}: stopping the replay and everything it started (again to quit at once)\n`,
      );
      abort.abort(signal);
    } else if (now - firstAt > REPEAT_MS) process.exit(130);
  };
  for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(s, onSignal);
  const progress = replayProgress(process.stderr, options.quiet);
  try {
    const outcome = await runReplay(
      {
        ...options,
        compression: realStack.compression,
        attach: realStack.attach,
        geo: realStack.geo,
        root: fileURLToPath(new URL('..', import.meta.url)),
        env: process.env,
      },
      {
        say: (line) => {
          progress.end();
          process.stderr.write(`${line}\n`);
        },
        progress: (p) => progress.update(p),
        signal: abort.signal,
      },
    );
    progress.end();
    const o = outcome.plan;
    process.stdout.write(
      `\n${o.scenario.name} (seed ${o.seed}, ${o.regions.length} regions, real stack at ${o.compression}×${o.roundTrips === undefined ? '' : `, geo ${o.roundTrips} ms`})\n${outcome.table}\n`,
    );
    process.stderr.write(`wrote ${outcome.written.join(', ')}\n`);
    return 0;
  } catch (error) {
    progress.end();
    if (error instanceof SimConfigError) {
      process.stderr.write(`simulate: ${error.message}\n`);
      return 2;
    }
    if (error instanceof ReplayInterrupted) {
      process.stderr.write(`simulate: ${error.message}; the stack is stopped\n`);
      return 130;
    }
    if (error instanceof ReplayError) {
      process.stderr.write(`simulate: ${error.message}\n`);
      return 1;
    }
    throw error;
  } finally {
    for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.off(s, onSignal);
  }
}

function main(): number | Promise<number> {
  let parsed;
  const skipped: string[] = [];
  try {
    parsed = parseCli(process.argv.slice(2));
    if (!parsed.help && parsed.realStack === undefined) {
      planRuns(parsed, skipped);
      prepareOutDir(parsed.outDir);
    }
  } catch (error) {
    if (error instanceof SimConfigError) {
      process.stderr.write(
        `simulate: ${error.message}\n(run with --help for the scenarios, strategies and settings)\n`,
      );
      return 2;
    }
    throw error;
  }
  if (parsed.help) {
    process.stdout.write(usage());
    return 0;
  }
  for (const w of [...parsed.warnings, ...skipped]) process.stderr.write(`${w}\n`);
  if (parsed.realStack !== undefined) return replay(parsed, parsed.realStack);
  const progress = progressSink(process.stderr, parsed.quiet);
  const started = performance.now();
  let outcomes;
  try {
    outcomes = simulate(parsed, (done, total, fraction, label) =>
      progress.update(done, total, fraction, label),
    );
  } catch (error) {
    progress.finish();
    if (error instanceof SimConfigError) {
      process.stderr.write(`simulate: ${error.message}\n`);
      return 2;
    }
    throw error;
  }
  progress.finish();
  for (const outcome of outcomes) {
    process.stdout.write(`\n${outcome.scenario.name} (seed ${parsed.seed}, ${parsed.regionCount} regions)\n`);
    process.stdout.write(resultsTable(outcome.results) + '\n');
  }
  const written = writeOutputs(parsed.outDir, outcomes);
  const seconds = (performance.now() - started) / 1000;
  process.stderr.write(`wrote ${written.join(', ')} (${seconds.toFixed(1)} s)\n`);
  return 0;
}

void Promise.resolve(main()).then((code) => {
  process.exitCode = code;
});
