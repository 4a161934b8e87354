/**
 * Just enough of the Prometheus text exposition format to read the services' counters: `name{label="v",…} value`
 * lines, comments skipped. (prom-client writes the format but does not read it.)
 */
import { ownValue, setOwn } from '../../core/own-keys.js';

/** One sample: a metric name, its labels and value. */
export interface MetricSample {
  name: string;
  labels: Readonly<Record<string, string>>;
  value: number;
}

const LINE = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$/;
const LABEL = /([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

export function parsePrometheusText(text: string): MetricSample[] {
  const out: MetricSample[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const m = LINE.exec(line);
    if (m === null) continue;
    const value = Number(m[3] === '+Inf' ? Infinity : m[3] === '-Inf' ? -Infinity : m[3]);
    if (Number.isNaN(value)) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(LABEL))
      // One pass: in `\\n` the escaped backslash is taken first, so the `n` after it stays a letter.
      setOwn(
        labels,
        l[1]!,
        l[2]!.replace(/\\(["\\n])/g, (_, c: string) => (c === 'n' ? '\n' : c)),
      );
    out.push({ name: m[1]!, labels, value });
  }
  return out;
}

/** Sum of the samples of `name` whose labels include every pair of `where`. */
export function sumOf(
  samples: readonly MetricSample[],
  name: string,
  where: Readonly<Record<string, string>> = {},
): number {
  let sum = 0;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (Object.entries(where).every(([k, v]) => ownValue(s.labels, k) === v)) sum += s.value;
  }
  return sum;
}
