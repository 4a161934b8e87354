/** The results table the CLI prints (GitHub-flavoured markdown, so it pastes into docs as is). */
import type { StrategyResult } from '../metrics/result.js';

const num = (x: number | null, digits = 3) => (x === null ? 'never' : x.toFixed(digits));

export function resultsTable(results: readonly StrategyResult[]): string {
  const swept = results.some((r) => r.sweep !== undefined);
  const head = [
    ...(swept ? [results.find((r) => r.sweep)!.sweep!.setting] : []),
    'strategy',
    'overAdmission',
    'utilisation',
    'worst subject',
    'falseDenialRate',
    'falseAdmitRate',
    'convergence s',
    'shares settled s',
    'max share sum',
    'control msg/s',
    'p50 ms',
    'p99 ms',
    'requests',
  ];
  const rows = results.map((r) => [
    ...(swept ? [String(r.sweep?.value ?? '')] : []),
    r.strategy,
    num(r.overAdmission),
    r.utilisation === null ? 'n/a' : num(r.utilisation),
    r.worstSubject === null ? '-' : num(r.worstSubject.admittedFraction),
    num(r.falseDenialRate, 4),
    num(r.falseAdmissionRate, 4),
    num(r.convergenceSeconds, 0),
    r.maxShareSum === null ? '-' : num(r.sharesSettledSeconds, 0),
    r.maxShareSum === null ? '-' : num(r.maxShareSum),
    num(r.controlMessagesPerSecond, 1),
    num(r.latencyMs.p50, 1),
    num(r.latencyMs.p99, 1),
    String(r.requests),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
  const line = (cells: readonly string[]) =>
    `| ${cells.map((c, i) => (i < (swept ? 2 : 1) ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ')} |`;
  const rule = `| ${widths.map((w, i) => (i < (swept ? 2 : 1) ? '-'.repeat(w) : '-'.repeat(w - 1) + ':')).join(' | ')} |`;
  return [line(head), rule, ...rows.map(line)].join('\n');
}
