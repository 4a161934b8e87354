/**
 * sharesSettledSeconds: after each shift of the scenario (from 0 when it has none), how long until the shares in
 * force stop moving, that is until every region's share (sampled at each bin start) stays within
 * SHARE_SETTLE_TOLERANCE of the share it holds at the end of the phase. It measures a strategy's reaction time
 * apart from whether its admissions match the oracle's (convergenceSeconds). The worst phase counts; null when
 * some phase settles only in its last `holdBins` (it was still moving) or the strategy has no shares.
 */
import { roundSeconds } from './convergence.js';

/** Shares closer than this (absolute) to where they end the phase have settled: the rebalancer's settle band. */
export const SHARE_SETTLE_TOLERANCE = 0.02;

export function sharesSettledSeconds(
  samples: readonly (readonly number[])[] | undefined,
  shiftsS: readonly number[],
  o: { binS: number; fullBins: number; holdBins: number },
): number | null {
  if (samples === undefined || samples.length === 0) return null;
  const starts = shiftsS.length === 0 ? [0] : [...shiftsS].sort((a, b) => a - b);
  let worst = 0;
  for (let p = 0; p < starts.length; p++) {
    const shiftS = starts[p]!;
    const first = Math.ceil(shiftS / o.binS);
    const end = Math.min(
      samples.length,
      p + 1 < starts.length ? Math.floor(starts[p + 1]! / o.binS) : o.fullBins,
    );
    if (end <= first) return null;
    const final = samples[end - 1]!;
    let from = first;
    for (let k = end - 1; k >= first; k--) {
      if (samples[k]!.some((s, r) => Math.abs(s - final[r]!) > SHARE_SETTLE_TOLERANCE)) {
        from = k + 1;
        break;
      }
    }
    if (from > first && end - from < o.holdBins) return null;
    worst = Math.max(worst, from * o.binS - shiftS);
  }
  return roundSeconds(worst);
}
