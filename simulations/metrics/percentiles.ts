/** Nearest-rank percentile (p in (0, 100]) of ascending `sorted`; 0 for an empty list. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return 0;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!;
}

/** A growable list of doubles that sorts numerically. */
export class Samples {
  #data = new Float64Array(1024);
  length = 0;

  push(value: number): void {
    if (this.length === this.#data.length) {
      const grown = new Float64Array(this.#data.length * 2);
      grown.set(this.#data);
      this.#data = grown;
    }
    this.#data[this.length++] = value;
  }

  sorted(): Float64Array {
    return this.#data.slice(0, this.length).sort();
  }
}
