/**
 * A map of at most `maxEntries` entries that forgets the least recently written one first: memory an agent keeps
 * per subject (the last refusal `GET /v1/explain` shows) stays bounded however many subjects it sees. Reads do
 * not count as use: looking an entry up (an operator's explanation) changes nothing, eviction order included.
 * Pure: no I/O, no clock.
 */

/** Most entries a BoundedLru may be configured with. */
export const MAX_LRU_ENTRIES = 1_000_000;

export class BoundedLru<V> {
  /** A Map iterates in insertion order: the first key is the least recently written one. */
  readonly #entries = new Map<string, V>();
  readonly maxEntries: number;

  /** `maxEntries` 0 keeps nothing (every `set` is dropped at once). */
  constructor(maxEntries: number) {
    if (!Number.isInteger(maxEntries) || maxEntries < 0 || maxEntries > MAX_LRU_ENTRIES) {
      throw new RangeError(`maxEntries must be a whole number in 0..${MAX_LRU_ENTRIES}, got ${maxEntries}`);
    }
    this.maxEntries = maxEntries;
  }

  /** Entries held now, never more than `maxEntries`. */
  get size(): number {
    return this.#entries.size;
  }

  /** The entry of `key`, or undefined; a read does not make it recent. */
  get(key: string): V | undefined {
    return this.#entries.get(key);
  }

  /**
   * Write `key`: a new key, or a new value for a key held (replaced in place, never a second entry), becomes the
   * most recent; beyond `maxEntries` the least recently written entries are forgotten.
   */
  set(key: string, value: V): void {
    this.#entries.delete(key);
    this.#entries.set(key, value);
    while (this.#entries.size > this.maxEntries) {
      const oldest = this.#entries.keys().next();
      if (oldest.done === true) break;
      this.#entries.delete(oldest.value);
    }
  }

  /** Keys from the least to the most recently written (for tests and diagnostics). */
  keys(): string[] {
    return [...this.#entries.keys()];
  }
}
