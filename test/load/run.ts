/**
 * `npm run test:load [-- --short] [--geo] [--only campaign,hotTenant,…]`: the load suite (`--geo`: on regions a WAN
 * apart). Starts the stack as `npm start` does (free ports, loopback
 * only), runs every seed scenario in turn, prints one table row per scenario and, for the full run, writes the
 * table to docs/reliability.md. Exits 1 when a row breaks its own check (admitted above its bound, a false
 * denial, an answer that is neither a decision nor an explicit shed), 0 otherwise. Every loop is bounded in
 * count and time; the whole suite stops by itself (the short one in about a minute).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { format, resolveConfig } from 'prettier';
import { startRealStack, type RealStack } from '../helpers/real-stack.js';
import { closeLoadPool, scenarios, type Row } from './scenarios.js';

const { values } = parseArgs({
  options: {
    short: { type: 'boolean', default: false },
    only: { type: 'string' },
    geo: { type: 'boolean', default: false },
  },
});
const short = values.short;
// --geo: the same rows on the geo topology (npm start -- --geo: regions 70-220 ms apart, docs/running.md). The
// rows' bounds are the same; only the full loopback run writes docs/reliability.md's table.
const geo = values.geo;
const only = values.only?.split(',');
const chosen = scenarios.filter((s) => only === undefined || only.includes(s.name));
if (chosen.length === 0) {
  console.error(`no scenario named ${values.only ?? ''}; known: ${scenarios.map((s) => s.name).join(', ')}`);
  process.exit(2);
}

const header =
  '| scenario | offered | admitted | bound | false denials by reason | shed | p50 ms | p99 ms | errors |';
const rule = '| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |';
const line = (r: Row) => {
  const denials = Object.entries(r.falseDenials)
    .map(([why, n]) => `${why}: ${n}`)
    .join(', ');
  return `| ${r.scenario} | ${r.offered} | ${r.admitted} | ${r.bound ?? '—'} | ${denials || 'none'} | ${r.shed} | ${r.p50} | ${r.p99} | ${r.errors} |`;
};

const started = Date.now();
// What else the machine was doing: figures taken beside other work say little (docs/reliability.md).
const loadAtStart = loadavg()[0]!;
// SIGTERM or SIGINT (a `timeout` around the suite, a Ctrl-C, a cancelled CI job): stop the stack, then exit 143
// (130), the one way out once a signal came. The launcher would notice its parent gone and stop too, but only
// after the suite had exited, with the stack still running.
const stopping = new AbortController();
let stack: RealStack | undefined;
const stopAndExit = async (signal: NodeJS.Signals): Promise<never> => {
  closeLoadPool();
  await stack?.[Symbol.asyncDispose]();
  process.exit(signal === 'SIGINT' ? 130 : 143);
};
/** Once a signal came: wait for stopAndExit, whatever the scenario in flight does as its pool closes. */
const stopped = (): Promise<never> => new Promise<never>(() => undefined);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping.signal.aborted) return;
    console.error(`\n${signal}: stopping the stack`);
    stopping.abort(signal);
    // While the stack starts, startRealStack stops it and rejects; the catch below exits.
    if (stack !== undefined) void stopAndExit(signal);
  });
}
try {
  stack = await startRealStack(geo ? { QP_STACK_TOPOLOGY: 'geo' } : {}, undefined, stopping.signal);
} catch (error) {
  if (stopping.signal.aborted) await stopAndExit(stopping.signal.reason as NodeJS.Signals);
  throw error;
}
const rows: Row[] = [];
console.log(header);
console.log(rule);
try {
  for (const scenario of chosen) {
    const row = await scenario({ stack, short });
    if (stopping.signal.aborted) await stopped();
    rows.push(row);
    console.log(line(row));
  }
} catch (error) {
  if (stopping.signal.aborted) await stopped();
  throw error;
} finally {
  if (!stopping.signal.aborted) {
    closeLoadPool();
    await stack[Symbol.asyncDispose]();
  }
}
for (const r of rows) if (r.notes !== undefined) console.log(`\n${r.scenario}: ${r.notes}`);
const failed = rows.filter((r) => r.problems.length > 0);
for (const r of failed) console.log(`\nFAILED ${r.scenario}: ${r.problems.join('; ')}`);
const seconds = Math.round((Date.now() - started) / 1000);
console.log(`\n${rows.length - failed.length} passed, ${failed.length} failed (${seconds} s)`);

if (!short && only === undefined && !geo) {
  const path = new URL('../../docs/reliability.md', import.meta.url);
  const doc = readFileSync(path, 'utf8');
  const begin = '<!-- load-table:begin -->';
  const end = '<!-- load-table:end -->';
  const at = doc.indexOf(begin);
  const until = doc.indexOf(end);
  if (at >= 0 && until > at) {
    const notes = rows.filter((r) => r.notes !== undefined).map((r) => `- ${r.scenario}: ${r.notes}`);
    const problems = failed.map((r) => `- **Failed** ${r.scenario}: ${r.problems.join('; ')}`);
    const load = (x: number) => x.toFixed(1);
    const table = [
      begin,
      `Measured ${new Date().toISOString().slice(0, 16)} UTC by \`npm run test:load\` in ${seconds} s on ${cpus().length} ` +
        `cores, load average ${load(loadAtStart)} at the start and ${load(loadavg()[0]!)} at the end ` +
        `(${rows.length - failed.length} passed, ${failed.length} failed).`,
      '',
      header,
      rule,
      ...rows.map(line),
      '',
      ...notes,
      ...problems,
      end,
    ].join('\n');
    // Formatted as the rest of the docs are (npm run lint checks it).
    const formatted = await format(doc.slice(0, at) + table + doc.slice(until + end.length), {
      ...(await resolveConfig(fileURLToPath(path))),
      filepath: fileURLToPath(path),
    });
    writeFileSync(path, formatted);
  }
}
process.exit(failed.length > 0 ? 1 : 0);
