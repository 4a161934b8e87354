/**
 * The replay's progress on stderr: one line redrawn in place on a terminal, otherwise a plain line at every 10% of
 * the wall time (logs and CI stay readable), nothing when quiet.
 */
import type { ReplayProgress } from './replayer.js';

interface Stream {
  isTTY?: boolean | undefined;
  write(text: string): unknown;
}

export function progressLine(p: ReplayProgress): string {
  const s = (ms: number) => (ms / 1000).toFixed(1);
  return (
    `replay ${p.policy}: ${s(Math.min(p.wallMs, p.totalWallMs))}/${s(p.totalWallMs)} s, ` +
    `sent ${p.sent}/${p.total}, answered ${p.answered}, admitted ${p.admitted}`
  );
}

/** A sink for ReplayProgress; `end()` closes a redrawn line. */
export function replayProgress(
  stream: Stream,
  quiet: boolean,
): { update(p: ReplayProgress): void; end(): void } {
  if (quiet) return { update: () => undefined, end: () => undefined };
  if (stream.isTTY === true) {
    let drawn = false;
    return {
      update(p) {
        drawn = true;
        stream.write(`\r${progressLine(p).padEnd(100)}`);
      },
      end() {
        if (drawn) stream.write('\n');
        drawn = false;
      },
    };
  }
  let last = -1;
  let policy = '';
  return {
    update(p) {
      if (p.policy !== policy) {
        policy = p.policy;
        last = -1;
      }
      const decile = Math.floor((Math.min(p.wallMs, p.totalWallMs) / p.totalWallMs) * 10);
      if (decile <= last) return;
      last = decile;
      stream.write(`${progressLine(p)}\n`);
    },
    end: () => undefined,
  };
}
