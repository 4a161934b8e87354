/**
 * Progress on stderr: a redrawn bar when stderr is a terminal, otherwise a plain line at every 10% (logs and CI
 * stay readable), nothing when quiet.
 */

export interface ProgressSink {
  /** `done` of `total` runs finished, the current one `fraction` through; `label` names it. */
  update(done: number, total: number, fraction: number, label: string): void;
  finish(): void;
}

interface Stream {
  isTTY?: boolean | undefined;
  columns?: number | undefined;
  write(text: string): unknown;
}

export function progressSink(stream: Stream, quiet: boolean): ProgressSink {
  if (quiet) return { update: () => undefined, finish: () => undefined };
  if (stream.isTTY === true) {
    let last = -1;
    return {
      update(done, total, fraction, label) {
        const overall = (done + fraction) / total;
        const permille = Math.floor(overall * 1000);
        if (permille === last) return;
        last = permille;
        const width = 30;
        const filled = Math.round(overall * width);
        const bar = '█'.repeat(filled) + '░'.repeat(width - filled);
        const text = `\r${bar} ${(overall * 100).toFixed(1).padStart(5)}%  run ${Math.min(done + 1, total)}/${total} ${label}`;
        // Some terminals (and `script`) report 0 columns: fall back to a sane width.
        const columns = (stream.columns ?? 0) >= 40 ? stream.columns! : 100;
        stream.write(text.slice(0, columns).padEnd(Math.min(columns, 100)));
      },
      finish() {
        stream.write('\n');
      },
    };
  }
  let lastDecile = -1;
  return {
    update(done, total, fraction) {
      const decile = Math.floor(((done + fraction) / total) * 10);
      if (decile <= lastDecile) return;
      lastDecile = decile;
      stream.write(`simulate: ${decile * 10}%\n`);
    },
    finish: () => undefined,
  };
}
