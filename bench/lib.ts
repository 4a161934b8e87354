/** Shared pieces of the benchmarks: alternating runs, closed-loop load, result lines. */

/** One comparison of ours against a peer, measured in the same run. */
export interface Comparison {
  bench: string;
  ours: number;
  peer: string;
  peerValue: number;
  /** ours / peerValue: > 1 means ours is faster. */
  ratio: number;
  /** Free-form extra figures (latency percentiles, per-run values). */
  details?: Record<string, unknown>;
}

export interface BenchOptions {
  /** Seconds per measured run. */
  seconds: number;
  /** Runs per contender; contenders alternate (A B A B …) so drift hits both alike. */
  rounds: number;
}

export interface BenchSuite {
  name: string;
  run(options: BenchOptions, progress: (line: string) => void): Promise<Comparison[]>;
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/**
 * Closed-loop load: `concurrency` callers each await `op(i)` back to back for `seconds`. Returns operations per
 * second. Errors count as operations that happened (a denial that throws, as rate-limiter-flexible's does) only
 * when `acceptError` says so; anything else aborts the run.
 */
export async function closedLoop(
  op: (i: number) => Promise<unknown>,
  {
    concurrency,
    seconds,
    acceptError = () => false,
  }: { concurrency: number; seconds: number; acceptError?: (e: unknown) => boolean },
): Promise<number> {
  let done = 0;
  let counter = 0;
  const deadline = performance.now() + seconds * 1000;
  const start = performance.now();
  const worker = async () => {
    while (performance.now() < deadline) {
      try {
        await op(counter++);
      } catch (error) {
        if (!acceptError(error)) throw error;
      }
      done++;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return done / ((performance.now() - start) / 1000);
}

/** Run each contender `rounds` times, alternating, and return the per-run values of each. */
export async function alternate<K extends string>(
  contenders: Record<K, () => Promise<number>>,
  rounds: number,
  progress: (line: string) => void,
): Promise<Record<K, number[]>> {
  const names = Object.keys(contenders) as K[];
  const out = Object.fromEntries(names.map((n) => [n, [] as number[]])) as Record<K, number[]>;
  for (let r = 0; r < rounds; r++) {
    for (const name of r % 2 === 0 ? names : [...names].reverse()) {
      const value = await contenders[name]();
      out[name].push(value);
      progress(`  round ${r + 1}/${rounds} ${name}: ${Math.round(value).toLocaleString('en-US')}/s`);
    }
  }
  return out;
}
