/**
 * The replay's outputs, drawn with the simulator's own table, charts and HTML page: each row labelled with its
 * source (`dynamic (simulated)`, `dynamic (real stack)`), results.json keeping the plain strategy name and a
 * `source` field.
 */
import { runChartFiles } from '../report/charts.js';
import { outputFiles } from '../report/files.js';
import { htmlReport } from '../report/html.js';
import { resultsTable } from '../report/table.js';
import type { ReplayResult, ReplayRow } from './replay-result.js';

/** How a row is named in the table and on the charts. */
export function rowLabel(r: ReplayResult): string {
  if (r.strategy === 'ideal' && r.source === 'simulator') return 'ideal (oracle)';
  return `${r.strategy} (${r.source === 'real-stack' ? 'real stack' : 'simulated'})`;
}

const labelled = (rows: readonly ReplayRow[]) =>
  rows.map((row) => ({ result: { ...row.result, strategy: rowLabel(row.result) }, series: row.series }));

/** The simulator's table, one line per row, then what the real rows measured beside it. */
export function replayTable(rows: readonly ReplayRow[]): string {
  const lines = [resultsTable(labelled(rows).map((r) => r.result))];
  for (const { result: r } of rows) {
    const d = r.replay;
    if (d === undefined) continue;
    const control = d.controlMessages;
    lines.push(
      `${rowLabel(r)}: ${r.requests} requests in ${d.wallSeconds.toFixed(1)} s of wall time at ${d.compression}× ` +
        `(${d.wallRequestsPerSecond.toFixed(0)}/s), sent late by p50 ${d.sendLagMs.p50.toFixed(1)} / p99 ` +
        `${d.sendLagMs.p99.toFixed(1)} ms, ${d.noDecision} without a decision, ${d.shed} shed` +
        (Object.keys(r.degraded).length > 0
          ? `, degraded: ${Object.entries(r.degraded)
              .map(([k, v]) => `${k} ${v}`)
              .join(', ')}`
          : '') +
        (control === null
          ? ''
          : `; control messages ${control.total} (heartbeats ${control.heartbeat}, usage ${control.usage}, acks ${control.ack}, record writes ${control.recordWrites}, loans ${control.loans})`) +
        (d.agents === undefined
          ? ''
          : `; loan answers ${
              Object.entries(d.agents.loanAnswers)
                .map(([k, v]) => `${k} ${v}`)
                .join(', ') || 'none'
            }, grants believed less than given ${d.agents.grantsDistrusted}, Redis timeouts ${d.agents.storeTimeouts}`),
    );
  }
  lines.push(
    'Real rows: latency (p50, p99) in wall ms from send to answer; rates per scenario second; max share sum from',
    'the shares the coordinator issued (sampled every bin). Simulated rows: latency in scenario ms.',
  );
  return lines.join('\n');
}

/** Write results.json, admitted.svg, shares.svg and report.html into `dir`; returns the paths. */
export function writeReplay(dir: string, title: string, rows: readonly ReplayRow[], table: string): string[] {
  const { put, written } = outputFiles(dir);
  put(
    'results.json',
    JSON.stringify(
      rows.map((r) => r.result),
      null,
      2,
    ) + '\n',
  );
  const runs = labelled(rows);
  const svgs: string[] = [];
  for (const { name, svg } of runChartFiles(runs)) {
    put(name, svg);
    svgs.push(svg);
  }
  put(
    'report.html',
    htmlReport(
      title,
      runs.map((r) => r.result),
      table,
      svgs,
    ),
  );
  return written;
}
