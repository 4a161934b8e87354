/** A self-contained HTML page: the results table, the charts inline, and how to read them. */
import type { StrategyResult } from '../metrics/result.js';

function esc(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

export function htmlReport(
  title: string,
  results: readonly StrategyResult[],
  table: string,
  svgs: readonly string[],
): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>${esc(title)}</title>
<style>
body { font-family: sans-serif; margin: 2em; max-width: 980px; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }
figure { margin: 1.5em 0; }
</style>
</head>
<body>
<h1>${esc(title)}</h1>
<p>Seed ${results[0]?.seed ?? ''}, regions ${esc(results[0]?.regions.join(', ') ?? '')}, ${results[0]?.durationS ?? ''} simulated seconds.
overAdmission is the worst subject's most-admitted window (1, 10 or 60 s) over what the budget allows in it (C + R·W):
above 1 the budget was exceeded. utilisation is admitted tokens over what the ideal oracle admitted on the same
arrivals; falseDenialRate counts requests the strategy denied that the oracle admitted. Dashed grey lines are the
oracle; dashed black lines the budget (or, on share charts, the sum of shares: at most 1 conserves the budget).</p>
<pre>${esc(table)}</pre>
${svgs.map((svg) => `<figure>\n${svg}</figure>`).join('\n')}
</body>
</html>
`;
}
