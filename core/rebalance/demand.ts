/**
 * Smoothed demand: an exponentially weighted rate of requested cost (admitted + denied) per key, decayed by
 * elapsed time so irregular report intervals weigh correctly.
 */
export class DemandTracker<K> {
  readonly #halfLifeMs: number;
  readonly #rates = new Map<K, { rate: number; at: number; tag: number }>();

  constructor(halfLifeMs: number) {
    if (!(halfLifeMs > 0)) throw new RangeError('halfLifeMs must be > 0');
    this.#halfLifeMs = halfLifeMs;
  }

  /**
   * Fold in `cost` requested over the `intervalMs` ending at `now`. The observed rate (cost per second) is blended
   * with the stored one by a weight that depends on the interval length relative to the half-life.
   */
  observe(key: K, cost: number, intervalMs: number, now: number, tag = 0): void {
    if (!(intervalMs > 0) || !(cost >= 0)) return;
    const observed = (cost * 1000) / intervalMs;
    const entry = this.#rates.get(key);
    if (entry === undefined) {
      this.#rates.set(key, { rate: observed, at: now, tag });
      return;
    }
    const weight = 1 - Math.pow(0.5, intervalMs / this.#halfLifeMs);
    entry.rate = entry.rate + weight * (observed - entry.rate);
    entry.at = Math.max(entry.at, now);
  }

  /**
   * Set `key` to a known smoothed `rate` as of `at` (a successor's start from its predecessor's estimate); it
   * decays from `at` like any key not heard from since.
   */
  seed(key: K, rate: number, at: number, tag = 0): void {
    if (!(rate >= 0) || !Number.isFinite(rate)) return;
    this.#rates.set(key, { rate, at, tag });
  }

  /** Smoothed rate of `key` at `now` (cost per second); a key not heard from decays toward 0. */
  rate(key: K, now: number): number {
    const entry = this.#rates.get(key);
    return entry === undefined ? 0 : this.#decayed(entry, now);
  }

  /** Add each key's rate at `now` to `out[tag]` (the tag given when it was observed, e.g. a region index). */
  sumByTag(now: number, out: number[]): number[] {
    for (const entry of this.#rates.values())
      out[entry.tag] = (out[entry.tag] ?? 0) + this.#decayed(entry, now);
    return out;
  }

  /** Latest observation time per tag (-Infinity for tags never seen). */
  lastSeenByTag(out: number[]): number[] {
    for (const entry of this.#rates.values())
      out[entry.tag] = Math.max(out[entry.tag] ?? -Infinity, entry.at);
    return out;
  }

  #decayed(entry: { rate: number; at: number }, now: number): number {
    const silence = now - entry.at;
    // Reports arrive every round; silence beyond two half-lives means the key went quiet.
    return silence > 2 * this.#halfLifeMs
      ? entry.rate * Math.pow(0.5, (silence - 2 * this.#halfLifeMs) / this.#halfLifeMs)
      : entry.rate;
  }

  /** Time of the last observation of `key`, or undefined. */
  lastSeen(key: K): number | undefined {
    return this.#rates.get(key)?.at;
  }

  /** Time of the most recent observation of any key (0 when empty). */
  lastSeenAny(): number {
    let last = 0;
    for (const entry of this.#rates.values()) last = Math.max(last, entry.at);
    return last;
  }

  /** Keys with a stored rate. */
  keys(): IterableIterator<K> {
    return this.#rates.keys();
  }

  delete(key: K): void {
    this.#rates.delete(key);
  }

  /** Drop keys silent for longer than `maxSilenceMs`. */
  prune(now: number, maxSilenceMs: number): void {
    for (const [key, entry] of this.#rates) if (now - entry.at > maxSilenceMs) this.#rates.delete(key);
  }

  get size(): number {
    return this.#rates.size;
  }
}
