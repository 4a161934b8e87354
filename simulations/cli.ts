/**
 * `npm run simulate -- …`: the only file of simulations/ that reads argv, writes to the terminal and exits.
 * Exit codes: 0 done, 2 bad flags or settings (message on stderr), 1 anything unexpected.
 */
import { parseCli, usage } from './cli-args.js';
import { SimConfigError } from './errors.js';
import { progressSink } from './report/progress.js';
import { resultsTable } from './report/table.js';
import { planRuns, simulate, writeOutputs } from './simulate.js';

function main(): number {
  let parsed;
  try {
    parsed = parseCli(process.argv.slice(2));
    if (!parsed.help) planRuns(parsed);
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
  for (const w of parsed.warnings) process.stderr.write(`${w}\n`);
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

process.exitCode = main();
