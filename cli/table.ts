/**
 * Plain-text tables for the terminal: a header row, columns padded to their widest cell, numbers aligned
 * right. No colours and no box drawing, so output pastes into tickets and greps cleanly.
 */

export type Cell = string | number | boolean | null | undefined;

export interface Column {
  readonly header: string;
  /** Right-align (numbers). Default: right when every cell of the column is a number. */
  readonly right?: boolean;
}

/** `—` for a missing value; numbers as JavaScript prints them (callers round first). */
export function cellText(cell: Cell): string {
  if (cell === null || cell === undefined || cell === '') return '—';
  if (typeof cell === 'boolean') return cell ? 'yes' : 'no';
  return String(cell);
}

export function table(columns: readonly (string | Column)[], rows: readonly (readonly Cell[])[]): string {
  const cols = columns.map((c) => (typeof c === 'string' ? { header: c } : c));
  const text = rows.map((row) => cols.map((_, i) => cellText(row[i])));
  const right = cols.map(
    (c, i) => c.right ?? (rows.length > 0 && rows.every((r) => typeof r[i] === 'number' || r[i] == null)),
  );
  const widths = cols.map((c, i) => Math.max(c.header.length, ...text.map((r) => r[i]!.length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, i) => (right[i] ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(cols.map((c) => c.header)), ...text.map(line)].join('\n');
}

/** Two columns, field and value: one record. */
export function record(entries: readonly (readonly [string, Cell])[]): string {
  const width = Math.max(...entries.map(([k]) => k.length));
  return entries.map(([k, v]) => `${k.padEnd(width)}  ${cellText(v)}`).join('\n');
}

/** A share as a percentage with two decimals (`33.33%`). */
export function percent(share: number): string {
  return `${(Math.round(share * 10_000) / 100).toFixed(2)}%`;
}

/** An ISO instant as its age or remaining time from `now` (`in 4.2s`, `12s ago`). */
export function relative(iso: string | null, now: number): string {
  if (iso === null) return '—';
  const delta = Date.parse(iso) - now;
  // 9.96 s is "10s", not "10.0s": round first, then choose the form.
  const seconds = Math.round(Math.abs(delta) / 100) / 10;
  const amount = seconds < 10 ? seconds.toFixed(1) : String(Math.round(seconds));
  return delta >= 0 ? `in ${amount}s` : `${amount}s ago`;
}
