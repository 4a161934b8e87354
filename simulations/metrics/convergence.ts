/**
 * convergenceSeconds: after a demand shift, how long until the strategy admits what the ideal oracle admits on the
 * same arrivals. Admissions are binned (binS) and compared over sliding windows of `windowBins` bins; the strategy
 * has converged at the start of the first window from which every window up to the next shift (or the end) is
 * within `tolerance` of ideal (|S − I| ≤ tolerance·I + slack), provided at least `holdBins` of the phase remain
 * from there (a lucky last window is not convergence). Measured after every shift (from 0 when there is none); the
 * worst one counts. null when some phase never converges.
 */
export interface ConvergenceOptions {
  binS: number;
  windowBins: number;
  tolerance: number;
  /** Absolute slack, tokens per window (one largest request), so a quiet window is not judged on one token. */
  slack: number;
  /** Bins that cover the run entirely (a trailing partial bin is ignored). */
  fullBins: number;
  /** Bins of the phase that must remain after the convergence instant. */
  holdBins: number;
}

export function convergenceSeconds(
  strategyBins: ArrayLike<number>,
  idealBins: ArrayLike<number>,
  shiftsS: readonly number[],
  o: ConvergenceOptions,
): number | null {
  const starts = shiftsS.length === 0 ? [0] : [...shiftsS].sort((a, b) => a - b);
  let worst = 0;
  for (let p = 0; p < starts.length; p++) {
    const shiftS = starts[p]!;
    const first = Math.ceil(shiftS / o.binS);
    const end = p + 1 < starts.length ? Math.floor(starts[p + 1]! / o.binS) : o.fullBins;
    const lastStart = end - o.windowBins;
    if (lastStart < first) return null;
    let from = first;
    for (let k = lastStart; k >= first; k--) {
      let s = 0;
      let i = 0;
      for (let b = k; b < k + o.windowBins; b++) {
        s += strategyBins[b] ?? 0;
        i += idealBins[b] ?? 0;
      }
      if (Math.abs(s - i) > o.tolerance * i + o.slack) {
        from = k + 1;
        break;
      }
    }
    if (from > lastStart || end - from < o.holdBins) return null;
    worst = Math.max(worst, from * o.binS - shiftS);
  }
  // A shift between bin starts (150.1 s) leaves float noise in the difference (151 - 150.1 = 0.9000000000000057).
  return roundSeconds(worst);
}

/** Seconds to the µs, as the other timings of results.json: no float noise from subtracting a fractional shift. */
export function roundSeconds(s: number): number {
  return Math.round(s * 1e6) / 1e6;
}
