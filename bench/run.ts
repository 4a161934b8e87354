/**
 * `npm run bench [-- --json] [--only NAME[,NAME]] [--seconds S] [--rounds N] [--quick]`
 * Runs each suite and prints a table, or with --json one line per comparison:
 * {"bench": "...", "ours": N, "peer": "...", "peerValue": N, "ratio": X}
 */
import { parseArgs } from 'node:util';
import type { Comparison } from './lib.js';
import { suites } from './suites.js';

const { values } = parseArgs({
  options: {
    json: { type: 'boolean', default: false },
    only: { type: 'string' },
    seconds: { type: 'string' },
    rounds: { type: 'string' },
    /** Shorter runs (2 rounds of 2 s unless --seconds/--rounds say otherwise): a bounded look, not a figure. */
    quick: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});

if (values.help) {
  console.log(
    `usage: npm run bench -- [--json] [--only ${suites.map((s) => s.name).join('|')}] [--seconds 3] [--rounds 4] [--quick]`,
  );
  process.exit(0);
}

const seconds = Number(values.seconds ?? (values.quick ? '2' : '3'));
const rounds = Number(values.rounds ?? (values.quick ? '2' : '4'));
if (!(seconds > 0 && seconds <= 60) || !(Number.isInteger(rounds) && rounds >= 1 && rounds <= 20)) {
  console.error('--seconds must be in (0, 60] and --rounds an integer in [1, 20]');
  process.exit(2);
}
const only = values.only?.split(',');
const unknown = only?.filter((n) => !suites.some((s) => s.name === n)) ?? [];
if (unknown.length > 0) {
  console.error(`unknown suite(s): ${unknown.join(', ')}; known: ${suites.map((s) => s.name).join(', ')}`);
  process.exit(2);
}

const progress = (line: string) => process.stderr.write(line + '\n');
const results: Comparison[] = [];
for (const suite of suites.filter((s) => only === undefined || only.includes(s.name))) {
  progress(`${suite.name}: ${rounds} alternating rounds of ${seconds}s each`);
  results.push(...(await suite.run({ seconds, rounds }, progress)));
}

if (values.json) {
  for (const { bench, ours, peer, peerValue, ratio } of results) {
    console.log(JSON.stringify({ bench, ours, peer, peerValue, ratio }));
  }
} else {
  console.log(`\n${new Date().toISOString()}  node ${process.version}`);
  console.log('| bench | ours | peer | peer value | ratio |\n| --- | ---: | --- | ---: | ---: |');
  for (const r of results) {
    console.log(
      `| ${r.bench} | ${r.ours.toLocaleString('en-US')} | ${r.peer} | ${r.peerValue.toLocaleString('en-US')} | ${r.ratio} |`,
    );
  }
  for (const r of results)
    if (r.details !== undefined) console.log(`\n${r.bench}: ${JSON.stringify(r.details)}`);
}
