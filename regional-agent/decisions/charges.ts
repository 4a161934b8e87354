import type { Charge } from '../../core/reservations.js';
import type { GroupRun } from './group-run.js';

/**
 * What each check of an admitted request charged in this region's store (undefined for checks that no store
 * charged: failure modes, forwarded checks): what a reservation gives back when it settles for less.
 */
export function chargesOf(runs: readonly GroupRun[], n: number): (Charge | undefined)[] {
  const out = new Array<Charge | undefined>(n).fill(undefined);
  for (const run of runs) {
    const { group } = run;
    if (!run.charged) continue;
    if (group.kind === 'store') {
      group.checks.forEach((p, j) => {
        out[group.indexes[j]!] = {
          kind: 'bucket',
          policy: p.policy.name,
          key: p.bucket.key,
          capacity: p.bucket.capacity,
          cost: p.cost,
        };
      });
    } else if (group.kind === 'day' && run.dayStarts !== undefined) {
      group.checks.forEach((p, j) => {
        const start = run.dayStarts?.[j] ?? 0;
        if (start <= 0) return;
        out[group.indexes[j]!] = { kind: 'day', policy: p.policy.name, key: p.day.key, start, cost: p.cost };
      });
    } else if (group.kind === 'log' && run.written !== undefined) {
      group.checks.forEach((p, j) => {
        const w = run.written?.[j];
        if (w === undefined || w.stamp <= 0) return;
        out[group.indexes[j]!] = {
          kind: 'log',
          policy: p.policy.name,
          key: p.log.key,
          stamp: w.stamp,
          seq: w.seq,
          cost: p.cost,
        };
      });
    }
  }
  return out;
}
